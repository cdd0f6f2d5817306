"""gluoncv's Faster R-CNN and Mask R-CNN (ResNet-50 v1b, COCO classes, no pretrained weights) train
through ringmaster.mxnet's DistributedTrainer as gluoncv 0.10.5's Horovod training scripts do:
gluoncv_checks.py as both ranks of a `ringmaster local` job, two steps per model on synthetic
COCO-shaped batches, every loss finite and the parameters identical on every rank after each step.

Runs in the MXNet virtual environment with gluoncv (`scripts/mxnet-venv.sh --gluoncv`: MXNet 1.9.1,
numpy 1.23.5, gluoncv 0.10.5); where it could not be made, or has no gluoncv, the test is skipped
saying why (pytest -rs prints it). CPU only: about a minute and a half on two cores.
"""
import os
import re

import pytest

from local_jobs import HERE, describe, mxnet_venv_python, not_built, run_local

CHECKS = os.path.join(HERE, "gluoncv_checks.py")
MODELS = ("faster_rcnn_resnet50_v1b_coco", "mask_rcnn_resnet50_v1b_coco")
STEPS = 2


PYTHON, WHY = mxnet_venv_python("--gluoncv", imports="gluoncv, mxnet")

pytestmark = [not_built,
              pytest.mark.skipif(PYTHON is None, reason=WHY or "no MXNet environment with gluoncv")]


def test_gluoncv_rcnn_models_train_through_distributed_trainer():
    r = run_local(2, PYTHON, CHECKS, timeout=600)
    assert r.returncode == 0, describe(r)
    assert "FAIL" not in r.stdout, describe(r)
    counts = set()
    for rank in range(2):
        m = re.search(rf"^\[{rank}\] gluoncv_checks: rank {rank}: (\d+) checks passed$",
                      r.stdout, re.M)
        assert m, describe(r)
        counts.add(int(m.group(1)))
        for model in MODELS:
            for step in range(1, STEPS + 1):
                assert re.search(rf"^\[{rank}\] gluoncv_checks: rank {rank}: {model} step {step} "
                                 r"losses \[[^\]]+\] finite, parameters identical",
                                 r.stdout, re.M), f"{model} step {step} on rank {rank}\n" + \
                    describe(r)
    assert len(counts) == 1, describe(r)
