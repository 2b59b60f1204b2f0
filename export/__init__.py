"""`python -m export`: a trained model -> a TF Serving SavedModel, or one
LiteRT (.tflite) or ONNX (.onnx) file (see __main__)."""
