"""Ringmaster's Python package. `import ringmaster.torch as hvd` is Horovod's PyTorch API;
`from ringmaster import Estimator` submits training jobs as SageMaker's estimators do
(ringmaster.estimator), over the job client ringmaster.jobs."""
__version__ = "0.1.0"


def __getattr__(name):
    # Imported on first use: `import ringmaster.torch` needs neither gRPC nor the job stubs.
    if name in ("Estimator", "TrainingJob", "JobFailedError"):
        from ringmaster import estimator
        return getattr(estimator, name)
    raise AttributeError(f"module 'ringmaster' has no attribute '{name}'")
