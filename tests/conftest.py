"""Suite-wide set-up: libtpu on this TPU-less host must coexist across xdist workers."""

from tpu_export.tpu_backend.aot import prepare_cpu_host

prepare_cpu_host()  # sets ALLOW_MULTIPLE_LIBTPU_LOAD etc. only where no TPU is attached
