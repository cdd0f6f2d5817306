"""Run as every rank of a job (`ringmaster local --np N -- <mxnet venv python> gluoncv_checks.py`,
the venv made by `scripts/mxnet-venv.sh --gluoncv`): gluoncv 0.10.5's Faster R-CNN and Mask R-CNN
(ResNet-50 v1b, COCO classes, no pretrained weights) train through ringmaster.mxnet's
DistributedTrainer as gluoncv's Horovod training scripts do
(scripts/detection/faster_rcnn/train_faster_rcnn.py, scripts/instance/mask_rcnn/train_mask_rcnn.py):

- every rank initialises its network from a seed of its own (so the parameters differ until
  broadcast_parameters makes them root's), resolves the deferred shapes with one forward, then
  broadcast_parameters(net.collect_params()) and DistributedTrainer(net.collect_train_params(),
  'sgd', ...) after freezing what the scripts freeze (grad_req 'null' outside the train patterns);
- the data are synthetic COCO-shaped samples, different on every rank: one random SIZE x SIZE
  image, a few random valid boxes with class ids in [0, 80) (and, for Mask R-CNN, a binary mask per
  box), through the scripts' train transform (the RPN targets, from the network's own anchors) and
  batchify function;
- each step is gluoncv's own ForwardBackwardTask.forward_backward (the scripts' losses: RPN
  sigmoid cross-entropy and smooth L1, R-CNN softmax cross-entropy and smooth L1, and the mask's
  sigmoid cross-entropy on net.mask_target's targets) then trainer.step(per-rank batch size);
- after each step every loss is finite and every parameter (trained or frozen) is bit-identical on
  every rank (a digest of their bytes, gathered with allgather_object).

Prints one line per model and step, one line per failure, and "gluoncv_checks: rank R: N checks
passed"; exits 0 only if every check passed.
"""
import hashlib
import sys
import time
import warnings

import numpy as np
import mxnet as mx

import gluoncv as gcv
from gluoncv.data.batchify import FasterRCNNTrainBatchify, MaskRCNNTrainBatchify
from gluoncv.data.transforms.presets.rcnn import FasterRCNNDefaultTrainTransform
from gluoncv.model_zoo import get_model
from gluoncv.model_zoo.rcnn.faster_rcnn.data_parallel import \
    ForwardBackwardTask as FasterRCNNTask
from gluoncv.model_zoo.rcnn.mask_rcnn.data_parallel import ForwardBackwardTask as MaskRCNNTask

import ringmaster.mxnet as hvd
import rank_checks
from rank_checks import check

RANK = 0
SIZE = 1

IMAGE = 320        # every image is IMAGE x IMAGE (the scripts' short side is 800, max 1333)
BOXES = 3          # ground-truth boxes per image
STEPS = 2
BATCH = 1          # images per rank per step (the scripts' per-device batch)
NUM_CLASSES = 80   # COCO
CTX = mx.cpu()


def parameters_digest(net):
    """sha256 of every parameter's name, dtype, shape and bytes, in collect_params() order (the
    same on every rank: both build the same models in the same order), and their float64 sum."""
    digest, total = hashlib.sha256(), 0.0
    for name, p in net.collect_params().items():
        a = p.data().asnumpy()
        digest.update(f"{name} {a.dtype} {a.shape}".encode())
        digest.update(np.ascontiguousarray(a).tobytes())
        total += float(a.astype(np.float64).sum())
    return digest.hexdigest(), total


def synthetic_sample(rng, with_masks):
    """One COCO-shaped training sample: an HWC uint8 image, an (n, 5) label [x1, y1, x2, y2, cls]
    of valid boxes inside it and, with_masks, an (n, H, W) binary mask per box (a filled ellipse
    inscribed in its box; COCO's polygons need pycocotools to rasterise, which the venv lacks)."""
    image = mx.nd.array(rng.randint(0, 256, size=(IMAGE, IMAGE, 3)), dtype="uint8")
    wh = rng.uniform(0.15 * IMAGE, 0.6 * IMAGE, size=(BOXES, 2))
    xy = rng.uniform(0, 1, size=(BOXES, 2)) * (IMAGE - 1 - wh)
    label = np.concatenate([xy, xy + wh, rng.randint(0, NUM_CLASSES, size=(BOXES, 1))],
                           axis=1).astype(np.float32)
    if not with_masks:
        return image, label, None
    ys, xs = np.mgrid[0:IMAGE, 0:IMAGE]
    masks = []
    for x1, y1, x2, y2, _ in label:
        cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
        masks.append((((xs - cx) / rx) ** 2 + ((ys - cy) / ry) ** 2 <= 1).astype(np.float32))
    return image, label, mx.nd.array(np.stack(masks))


def make_batch(transform, batchify, rng, with_masks):
    """A batch as the scripts' DataLoader makes it (transform per sample, then batchify), split
    over this rank's one device as their split_and_load does: the tuple forward_backward takes."""
    samples = []
    for _ in range(BATCH):
        image, label, masks = synthetic_sample(rng, with_masks)
        img, bbox, cls_t, box_t, box_m = transform(image, label)
        samples.append((img, bbox, cls_t, box_t, box_m) + ((masks,) if with_masks else ()))
    batch = batchify(samples)
    # The scripts' split_and_load with one device: a field is one NDArray or a tuple of shards.
    return [(field[0] if isinstance(field, (list, tuple)) else field).as_in_context(CTX)
            for field in batch]


def train_checks(model):
    with_masks = model.startswith("mask_rcnn")
    gcv.utils.random.seed(1000 + RANK)  # python, numpy and MXNet: a different init per rank
    rng = np.random.RandomState(2000 + RANK)  # the data, different per rank

    net = get_model(model, pretrained=False, pretrained_base=False,
                    per_device_batch_size=BATCH)
    # The scripts initialise what the (pretrained) base did not; here nothing is pretrained. The
    # base's BatchNorm is frozen (global statistics 0 and 1: the identity), so a variance-keeping
    # init (He's) doubles the activations' variance at every residual block, 2^16 over ResNet-50,
    # and the losses blow up within two steps; Xavier's average-fan default keeps them in range.
    # Parameters with an init of their own (the heads' normal(0.01), the anchors) keep it.
    for param in net.collect_params().values():
        if param._data is None:
            param.initialize(default_init=mx.init.Xavier(), ctx=CTX)
    net.collect_params().reset_ctx(CTX)

    # The scripts' train transform and batchify function, at IMAGE instead of 800/1333, flips off
    # (Mask R-CNN's own transform rasterises COCO polygons with pycocotools; its RPN targets are
    # this transform's, and the masks come in ready made).
    transform = FasterRCNNDefaultTrainTransform(IMAGE, IMAGE, net, ashape=net.ashape,
                                                multi_stage=False, flip_p=0.0)
    batchify = (MaskRCNNTrainBatchify if with_masks else FasterRCNNTrainBatchify)(net, 1)
    batches = [make_batch(transform, batchify, rng, with_masks) for _ in range(STEPS)]

    # One forward to finish the deferred initialisation (the dense layers' input sizes).
    data, label = batches[0][0], batches[0][1]
    with mx.autograd.train_mode():
        net(data, label[:, :, :4], label[:, :, 4:5])
    mx.nd.waitall()
    before = hvd.allgather_object(parameters_digest(net)[0])
    check(len(set(before)) == SIZE,
          f"{model}: the ranks' initial parameters should differ before the broadcast: {before}")

    # The scripts' train(): freeze, broadcast everything, train what the patterns select.
    net.collect_params().setattr("grad_req", "null")
    with warnings.catch_warnings():  # the anchors are constant: "grad_req ... is ignored"
        warnings.filterwarnings("ignore", "Constant parameter", UserWarning)
        net.collect_train_params().setattr("grad_req", "write")
    if with_masks:
        for v in net.collect_params(".*bias").values():
            v.wd_mult = 0.0
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    digest, total = parameters_digest(net)
    after = hvd.allgather_object(digest)
    check(len(set(after)) == 1,
          f"{model}: parameters differ after broadcast_parameters: {after}")
    # What the patterns select includes the RPN's anchors, a constant that stays 'null'.
    trained = [n for n, p in net.collect_train_params().items() if p.grad_req != "null"]
    every = list(net.collect_params().keys())
    check(0 < len(trained) < len(every) and all(
        (n in trained) == (p.grad_req == "write") for n, p in net.collect_params().items()),
          f"{model}: {len(trained)} of {len(every)} parameters to train: {trained}")
    trainer = hvd.DistributedTrainer(net.collect_train_params(), "sgd",
                                     {"learning_rate": 0.001, "momentum": 0.9, "wd": 1e-4})

    rpn_cls_loss = mx.gluon.loss.SigmoidBinaryCrossEntropyLoss(from_sigmoid=False)
    rpn_box_loss = mx.gluon.loss.HuberLoss(rho=1. / 9.)  # == smoothl1
    rcnn_cls_loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    rcnn_box_loss = mx.gluon.loss.HuberLoss(rho=1.)  # == smoothl1
    if with_masks:
        rcnn_mask_loss = mx.gluon.loss.SigmoidBinaryCrossEntropyLoss(from_sigmoid=False)
        task = MaskRCNNTask(net, trainer, rpn_cls_loss, rpn_box_loss, rcnn_cls_loss,
                            rcnn_box_loss, rcnn_mask_loss, amp_enabled=False)
        names = ["RPN_Conf", "RPN_SmoothL1", "RCNN_CrossEntropy", "RCNN_SmoothL1", "RCNN_Mask"]
    else:
        task = FasterRCNNTask(net, trainer, rpn_cls_loss, rpn_box_loss, rcnn_cls_loss,
                              rcnn_box_loss, mix_ratio=1.0, amp_enabled=False)
        names = ["RPN_Conf", "RPN_SmoothL1", "RCNN_CrossEntropy", "RCNN_SmoothL1"]
    net.hybridize(static_alloc=False)  # the scripts hybridize unless told not to

    previous = total
    for step in range(1, STEPS + 1):
        tic = time.time()
        result = task.forward_backward(batches[step - 1])
        trainer.step(BATCH)
        losses = [float(x.asscalar()) for x in result[:len(names)]]
        digest, total = parameters_digest(net)
        everyone = hvd.allgather_object((digest, total))
        finite = all(np.isfinite(losses))
        identical = len({d for d, _ in everyone}) == 1
        check(finite, f"{model} step {step}: a loss is not finite: {dict(zip(names, losses))}")
        check(identical, f"{model} step {step}: parameters differ between ranks: {everyone}")
        check(total != previous and np.isfinite(total),
              f"{model} step {step}: the parameters did not change (sum {total!r})")
        previous = total
        if finite and identical:
            print(f"gluoncv_checks: rank {RANK}: {model} step {step} losses "
                  f"[{', '.join(f'{n}={v:.4f}' for n, v in zip(names, losses))}] finite, "
                  f"parameters identical ({time.time() - tic:.1f} s)", flush=True)


def faster_rcnn_checks():
    train_checks("faster_rcnn_resnet50_v1b_coco")


def mask_rcnn_checks():
    train_checks("mask_rcnn_resnet50_v1b_coco")


def main():
    global RANK, SIZE
    hvd.init()
    RANK, SIZE = hvd.rank(), hvd.size()
    rank_checks.rank = RANK
    check(SIZE >= 2, f"run with at least 2 ranks (size {SIZE}): the broadcast would check nothing")
    for fn in (faster_rcnn_checks, mask_rcnn_checks):
        rank_checks.section(fn, "GLUONCV_CHECKS_VERBOSE")
    hvd.shutdown()
    sys.exit(rank_checks.finish("gluoncv_checks"))


if __name__ == "__main__":
    main()
