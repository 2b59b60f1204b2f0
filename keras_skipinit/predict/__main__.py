from keras_skipinit.predict.cli import run

run()
