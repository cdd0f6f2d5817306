"""SageMaker's training instance types, as far as Ringmaster needs them: how many GPUs each has (the
device kind of its ranks and SageMaker's default processes per host with MPI)."""

# GPUs per instance type of SageMaker's GPU families (AWS's published figures).
_GPUS = {
    "ml.p2.xlarge": 1, "ml.p2.8xlarge": 8, "ml.p2.16xlarge": 16,
    "ml.p3.2xlarge": 1, "ml.p3.8xlarge": 4, "ml.p3.16xlarge": 8, "ml.p3dn.24xlarge": 8,
    "ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8, "ml.p5.48xlarge": 8,
    "ml.g4dn.xlarge": 1, "ml.g4dn.2xlarge": 1, "ml.g4dn.4xlarge": 1, "ml.g4dn.8xlarge": 1,
    "ml.g4dn.16xlarge": 1, "ml.g4dn.12xlarge": 4,
    "ml.g5.xlarge": 1, "ml.g5.2xlarge": 1, "ml.g5.4xlarge": 1, "ml.g5.8xlarge": 1,
    "ml.g5.16xlarge": 1, "ml.g5.12xlarge": 4, "ml.g5.24xlarge": 4, "ml.g5.48xlarge": 8,
    "ml.g6.xlarge": 1, "ml.g6.2xlarge": 1, "ml.g6.4xlarge": 1, "ml.g6.8xlarge": 1,
    "ml.g6.16xlarge": 1, "ml.g6.12xlarge": 4, "ml.g6.24xlarge": 4, "ml.g6.48xlarge": 8,
}
# SageMaker's CPU families: one process per host unless the distribution says otherwise.
_CPU_FAMILIES = ("c4", "c5", "c5n", "c6i", "c7i", "m4", "m5", "m5d", "m6i", "m7i", "r5", "r5d",
                 "t2", "t3", "trn1")


def gpus_of(instance_type):
    """GPUs of `instance_type` ("ml.p3dn.24xlarge": 8, "ml.c5.xlarge": 0); SageMaker's local
    mode: "local" 0, "local_gpu" 1. ValueError, naming it, for a type that is not known."""
    if instance_type in (None, "local"):
        return 0
    if instance_type == "local_gpu":
        return 1
    if instance_type in _GPUS:
        return _GPUS[instance_type]
    parts = str(instance_type).split(".")
    if len(parts) == 3 and parts[0] == "ml" and parts[1] in _CPU_FAMILIES:
        return 0
    families = sorted({t.split(".")[1] for t in _GPUS} | set(_CPU_FAMILIES))
    raise ValueError(f"instance_type '{instance_type}' is not a SageMaker training instance type "
                     f"Ringmaster knows (ml.<family>.<size> of {', '.join(families)}; or 'local', "
                     f"'local_gpu')")
