"""SageMaker's notebook, run on a Ringmaster cluster with only its import changed:

    from ringmaster.sagemaker.mxnet import MXNet        # was: from sagemaker.mxnet import MXNet
    from ringmaster.sagemaker.pytorch import PyTorch    # was: from sagemaker.pytorch import PyTorch

The estimators take the SageMaker Python SDK's arguments under their v1 and v2 names, read s3://
channels and write to an s3:// output_path as SageMaker does, and give each rank the training
container's environment (SM_*). docs/python-jobs.md maps every argument."""
from ringmaster.sagemaker.estimator import Framework  # noqa: F401
