#!/bin/bash
# One device call: install flax/optax/keras from the machine's own index, run the driver once (one chip open),
# pack every capture into xz parts under $OUT (at most 8 files come back). Usage: device_run.sh PLAN [DEADLINE_S]
cd "$(dirname "$0")"
t0=$(date +%s)
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: \
  --index-url file:///opt/pypi/simple --target /tmp/site flax optax keras > $OUT/pip.txt 2>&1
export PYTHONPATH=$PYTHONPATH:/tmp/site KERAS_BACKEND=jax PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=1
echo "pip $(( $(date +%s) - t0 ))s" | tee $OUT/log.txt
timeout "${3:-440}" python3 driver.py --out /tmp/caps --plan "$1" --deadline-s "${2:-330}" 2>&1 \
  | grep -v -i "warning" | tee -a $OUT/log.txt
cd /tmp/caps && tar -cf - . | xz -T0 -6 | split -b 15000000 - $OUT/caps.tar.xz.part-
ls -la $OUT; echo "total $(( $(date +%s) - t0 ))s"
