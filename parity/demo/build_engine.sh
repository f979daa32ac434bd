#!/usr/bin/env bash
# Build the TensorRT engine for model.int8.onnx on the Jetson; run it there, not on the host.
# Recipe: orin - Jetson Orin, TensorRT 10 (JetPack 6.1+), explicit QDQ INT8
# Needs TensorRT 10 (JetPack 6.1+). The model carries explicit Q/DQ: no calibrator, no calibration cache needed.
# Extra trtexec flags are passed through: ./build_engine.sh --verbose
set -euo pipefail
cd "$(dirname "$0")"
TRTEXEC="${TRTEXEC:-trtexec}"
if ! command -v "$TRTEXEC" >/dev/null 2>&1 && [ -x /usr/src/tensorrt/bin/trtexec ]; then
  TRTEXEC=/usr/src/tensorrt/bin/trtexec
fi
exec "$TRTEXEC" --onnx=model.int8.onnx --stronglyTyped --saveEngine=model.int8.plan --memPoolSize=workspace:2048 --skipInference "$@"
