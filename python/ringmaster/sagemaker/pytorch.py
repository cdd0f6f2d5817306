"""sagemaker.pytorch.PyTorch over Ringmaster (see ringmaster.sagemaker). Importing it does not
import PyTorch: the ranks do, and their PyTorch is compared with framework_version when the job
starts."""
from ringmaster.sagemaker.estimator import Framework


class PyTorch(Framework):
    """SageMaker's PyTorch estimator: a Horovod (ringmaster.torch) entry point run as a Ringmaster
    job. Takes SageMaker's arguments (v1 and v2 names; docs/python-jobs.md)."""

    FRAMEWORK = "pytorch"
    DEFAULT_JOB_NAME = "pytorch-training"
