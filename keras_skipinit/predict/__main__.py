import sys

from keras_skipinit.predict.cli import main

sys.exit(main())
