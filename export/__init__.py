"""`python -m export`: a trained model -> a TF Serving SavedModel (see __main__)."""
