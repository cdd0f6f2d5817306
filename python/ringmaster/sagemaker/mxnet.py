"""sagemaker.mxnet.MXNet over Ringmaster (see ringmaster.sagemaker). Importing it does not import
MXNet: the ranks do, and their MXNet is compared with framework_version when the job starts."""
from ringmaster.sagemaker.estimator import Framework


class MXNet(Framework):
    """SageMaker's MXNet estimator: a Horovod (ringmaster.mxnet) entry point run as a Ringmaster
    job. Takes SageMaker's arguments (v1 and v2 names; docs/python-jobs.md)."""

    FRAMEWORK = "mxnet"
    DEFAULT_JOB_NAME = "mxnet-training"
