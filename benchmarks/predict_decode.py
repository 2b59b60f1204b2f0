"""How fast `predict` reads images: a batch's files decoded one by one against
`image_folder.decode_all` (a thread per core, at most 8; PIL releases the GIL
while it decodes), on `records_feed`'s synthetic JPEG photographs (500x375 and
375x500), resized and centre-cropped as an ImageNet model's evaluation does
(shorter side 256, crop 224), batch 64, rounds interleaved; img/s and the
ratio. Both give the same arrays (checked).

    python benchmarks/predict_decode.py               # ~10 s on 2 cores
"""

import argparse
import os
import tempfile

import _common
import numpy as np
from PIL import Image

from keras_skipinit.data import image_folder
from records_feed import _photos

BATCH, SIZE, CROP = 64, 256, 224


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        files = []
        for i, (photo, _) in enumerate(_photos(BATCH)):
            files.append(os.path.join(folder, f"{i}.jpg"))
            Image.fromarray(photo).save(files[-1], quality=90)
        one = [image_folder.decode(f, "RGB", SIZE, CROP) for f in files]
        assert all(np.array_equal(a, b) for a, b in zip(one, image_folder.decode_all(files, "RGB", SIZE, CROP)))
        seconds = _common.interleaved({
            "one thread": lambda: [image_folder.decode(f, "RGB", SIZE, CROP) for f in files],
            "decode_all": lambda: image_folder.decode_all(files, "RGB", SIZE, CROP),
        }, rounds=args.rounds, steps=1)
    rates = {name: BATCH / s for name, s in seconds.items()}
    print(_common.table(["decode", "img/s", "x one thread"],
                        [(name, f"{rate:.0f}", f"{rate / rates['one thread']:.2f}") for name, rate in rates.items()]))
    print("wrote", _common.write("predict_decode", {"batch": BATCH, "size": SIZE, "crop": CROP, "rounds": args.rounds,
                                                     "images_per_s": rates}))


if __name__ == "__main__":
    main()
