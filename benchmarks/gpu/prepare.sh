#!/usr/bin/env bash
# Run HERE (TensorFlow venv, package registries reachable) before a lent GPU session: writes .gpu/
# (ignored), which benchmarks/gpu/session.sh needs on the GPU machine (JAX + CUDA, Python 3.12, no
# TensorFlow, no network):
#   .gpu/wheels/         what that image lacks (Keras, absl, h5py, matplotlib, protobuf and their
#                        dependencies; not numpy/scipy, which JAX brings), for CPython 3.12, and tensorboard
#                        without its dependencies (its event writer needs protobuf only; grpcio alone is 7 MiB)
#   .gpu/fashion-mnist/  Fashion-MNIST's first 9,600 training images, its last 5,000 and its 10,000 test
#                        images in TFDS's order, as IDX files (--train_examples=9600, with or without
#                        --validation_examples=5000, then picks the images a TensorFlow run picks)
# ~58 MiB with the working tree (2026-11-29): the device tool carries at most 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .gpu/wheels && mkdir -p .gpu/wheels .gpu/fashion-mnist
keras_version="$(python -c 'import keras; print(keras.__version__)')"
python -m pip download --quiet --dest .gpu/wheels --python-version 3.12 --only-binary=:all: \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  "keras==$keras_version" absl-py h5py matplotlib protobuf
python -m pip download --quiet --dest .gpu/wheels --no-deps --only-binary=:all: tensorboard
rm -f .gpu/wheels/numpy-* .gpu/wheels/scipy-*
TF_CPP_MIN_LOG_LEVEL=3 python benchmarks/gpu/fashion_mnist_subset.py .gpu/fashion-mnist --train_examples=9600 --validation_examples=5000
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> "$(git rev-parse --git-path info/exclude)"
du -sh .gpu
