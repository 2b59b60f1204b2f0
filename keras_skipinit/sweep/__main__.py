from keras_skipinit.sweep.cli import main

main()
