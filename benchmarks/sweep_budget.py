"""What a sweep run costs: the figures behind the sweeps' budget arithmetic.

For each depth, with the pieces `trainer.train` uses (the TFDS pipeline,
the model builder, the papers' optimizer): build time, first training step
(tracing), steady training throughput (median step), and one evaluation of
the whole test split (tracing included). A run of N images then costs about
build + first step + N / throughput + evaluation.

    python benchmarks/sweep_budget.py --dataset=fashion_mnist --depths=16,52,100 --batch_size=128
"""

import argparse
import statistics
import time

import _common
import keras

from keras_skipinit.data import pipelines, sources
from keras_skipinit.training import run_model, trainer
from keras_skipinit.optimizers import ScalarLRSGD


def measure(depth, args, dataset):
    keras.backend.clear_session()
    config = trainer.Config(depth=depth, width=args.width, normalization=args.normalization, batch_size=args.batch_size,
                             bn_momentum=0.9 if args.normalization == "batchnorm" else None)
    start = time.perf_counter()
    model = run_model.build_model(config, dataset)
    build = time.perf_counter() - start
    run_model.add_l2(model, config.l2)
    model.compile(optimizer=ScalarLRSGD(learning_rate=0.01, momentum=0.9),
                  loss=keras.losses.CategoricalCrossentropy(), metrics=[keras.metrics.CategoricalAccuracy()])
    batches = iter(pipelines.train_pipeline(dataset, args.batch_size, epoch=0))
    x, y = next(batches)
    start = time.perf_counter()
    model.train_on_batch(x, y)
    first = time.perf_counter() - start
    times = []
    for _ in range(args.steps):
        x, y = next(batches)
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    step = statistics.median(times)
    start = time.perf_counter()
    model.evaluate(pipelines.eval_pipeline(dataset, args.batch_size), verbose=0)
    evaluation = time.perf_counter() - start
    return {"depth": depth, "build_s": build, "first_step_s": first, "train_img_per_s": args.batch_size / step,
            "eval_s": evaluation, "num_test": dataset.num_test}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="fashion_mnist")
    p.add_argument("--depths", default="16,52,100")
    p.add_argument("--width", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--normalization", default="batchnorm")
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    dataset = sources.load(args.dataset, train_examples=args.batch_size * (args.steps + 1))
    rows = [measure(int(d), args, dataset) for d in args.depths.split(",")]
    print(f"{args.normalization}, batch {args.batch_size}, {args.dataset}")
    print(_common.table(("model", "build s", "first step s", "train img/s", f"eval s ({rows[0]['num_test']} images)"),
                        [(f"WRN-{r['depth']}-{args.width}", f"{r['build_s']:.1f}", f"{r['first_step_s']:.1f}",
                          f"{r['train_img_per_s']:.0f}", f"{r['eval_s']:.1f}") for r in rows]))
    print("wrote", _common.write(f"sweep_budget_{args.dataset}_{args.normalization}_b{args.batch_size}",
                                 {"args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
