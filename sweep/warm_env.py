"""What the case forkserver is told to warm: the environment variables and the backends that can be warmed.

:mod:`sweep.isolation` sets the variables before it starts the forkserver; :mod:`sweep.warmup` reads them inside
it. Both import them from here, one layer down, so that neither imports the other.
"""

WARM_ENV = "EXPORT_SWEEP_WARM"  # comma-separated backends to warm (maybe none); set: the forkserver imports warmup
WARM_CATALOG_ENV = "EXPORT_SWEEP_WARM_CATALOG"  # "0": no case needs the class catalog (--model-module models only)
WARMABLE = ("dynamo", "onnx", "executorch")  # backends sweep.warmup knows how to warm
