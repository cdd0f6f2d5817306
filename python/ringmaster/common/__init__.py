"""What ringmaster.torch and ringmaster.mxnet share, as Horovod's horovod/common is shared by its
frameworks: reduction ops and names (ops), process sets (process_sets), and collectives of raw bytes
and picklable objects (objects). Nothing here imports a framework."""
