"""What a sweep runs next, as pure functions of the results so far: an
interrupted sweep resumes exactly, and an executor that runs a whole round at
once makes the same decisions as one that runs one run at a time.

A cell is (method, depth, batch size). A run is identified by
``(method, depth, batch_size, lr, seed, phase)``; phase SELECT runs choose
the learning rate (on the validation split under the converged and
batch-scaling protocols), FINAL runs are reported on the test set.
"""

import math

import numpy as np

from keras_skipinit import spec

SELECT, FINAL = "select", "final"
PAPER_LOG2_RANGE = (-10, 2)  # SkipInit §2.3: learning rates 2^-10 .. 2^2
CHOOSING = ("converged", "batch_scaling")  # protocols that choose on validation, then run final seeds
EDGE = "edge"  # the largest rate that trains, per cell
SURVIVAL = "survival"  # per rate, the fraction of seeds that train, with its interval
LOSS_MARGIN = 0.1  # trained by loss: the final training cross-entropy below ln(classes) - this
Z95 = 1.959964  # the standard normal's 97.5% quantile: two-sided 95% intervals
MAX_LOG2_LR = 30  # a learning rate outside 2^-30..2^30 is a typing error (--log2_lrs=5000 overflowed)


def lr_key(lr):
    return float(f"{lr:.6g}")


def lr_label(lr):
    log2 = math.log2(lr)  # tolerant: summaries key learning rates to 6 digits (`lr_key`)
    octaves = round(2 * log2) / 2  # whole or half
    return f"2^{octaves:g}" if abs(log2 - octaves) < 1e-5 else f"{lr:g}"


def log2_label(value):
    """A log2 rate as the survival tables show it ('2^-3.50'; None: '—', off the grid)."""
    return "—" if value is None else f"2^{value:.2f}"


def ident(key, depth, batch, lr, seed, phase=SELECT):
    return key, depth, batch, lr_key(lr), seed, phase


def run_ident(run):
    """A recorded run's ident (runs before batch sizes were a cell's axis
    carry theirs in results.config only)."""
    batch = run.get("batch_size") or ((run.get("results") or {}).get("config") or {}).get("batch_size")
    return ident(run["method"], run["depth"], batch, run["lr"], run["seed"], run.get("phase", SELECT))


def cells(settings):
    """Every (method, depth, batch size) in the sweep's order: depth, batch size, then method."""
    return [(key, depth, batch) for depth in settings.depths for batch in settings.batch_sizes
            for key in settings.methods]


def in_cell(runs, cell, phase=None):
    key, depth, batch = cell
    return [r for r in runs if run_ident(r)[:3] == (key, depth, batch)
            and (phase is None or r.get("phase", SELECT) == phase)]


# The training settings that make runs one experiment: one --out holds runs that agree on them
# (runner.check_same_experiment), and a --beside folder is shown only if its sweep does. The method,
# depth, batch, rate and seed are a run's ident; speed settings, paths and --mixed_precision=auto (which
# differs by machine on purpose) are not the experiment.
EXPERIMENT = spec.EXPERIMENT  # the settings one sweep folder's runs share (`spec.setting(experiment=True)`)


def summarize(runs, best_k, chance, key="test_top1", lower_is_better=False):
    """Per learning rate: mean and std of the best k of n values of `key`.

    A diverged run, or (for accuracy) one at or below `chance`, is failed;
    a learning rate where one of the best k failed is failed. Returns the best
    learning rate's row (None if every one failed) and all rows.
    """
    by_lr = {}
    for run in runs:
        value = run.get(key) if run["status"] == "completed" else None
        if value is not None and not lower_is_better and value <= chance:
            value = None
        by_lr.setdefault(lr_key(run["lr"]), []).append(value)
    worst = math.inf if lower_is_better else -math.inf
    rows = []
    for lr, values in sorted(by_lr.items()):
        ranked = sorted((v if v is not None else worst for v in values), reverse=not lower_is_better)[:best_k]
        failed = not ranked or any(not math.isfinite(v) for v in ranked)
        rows.append({
            "lr": lr,
            "runs": len(values),
            "failed": sum(v is None for v in values),
            "mean": None if failed else float(np.mean(ranked)),
            "std": None if failed else float(np.std(ranked)),
        })
    return best_row(rows, lower_is_better), rows


def best_row(rows, lower_is_better=False):
    """The best of `summarize`'s rows (None if every rate failed); also of
    rows read back from a summary.json."""
    scored = [r for r in rows if r["mean"] is not None]
    pick = min if lower_is_better else max
    return pick(scored, key=lambda r: r["mean"]) if scored else None


def grid_edge(best, rows):
    """Where a cell's best learning rate sits in the grid it was tried on:
    'interior', 'edge' (a better one may lie beyond) or 'paper bound'
    (2^-10 or 2^2, the ends of the paper's range)."""
    lrs = sorted(r["lr"] for r in rows)
    if lrs[0] < best["lr"] < lrs[-1]:
        return "interior"
    return "paper bound" if round(math.log2(best["lr"])) in PAPER_LOG2_RANGE else "edge"


def next_log2_lr(best, rows):
    """The learning rate that --extend_grid tries next for a cell, or None."""
    log2s = sorted(round(math.log2(r["lr"])) for r in rows)
    low, high = PAPER_LOG2_RANGE
    if best is None:  # everything failed: smaller learning rates first
        return log2s[0] - 1 if log2s[0] > low else None
    at = round(math.log2(best["lr"]))
    if at == log2s[0] and at > low:
        return at - 1
    if at == log2s[-1] and at < high:
        return at + 1
    return None


def stability_edge(rows):
    """A cell's stability edge and the rate that brackets it next:
    (edge, next) as log2 rates. `rows` are `summarize`'s with best_k = k, so
    a rate trained when at least k of its seeds beat chance without
    diverging. The edge is the largest rate below the first failing one above
    the smallest that trained (a rate that trains above a failing one is seed
    noise at the edge, not a wider stable range); the search goes one octave
    above it until a rate fails, or, while none trained, one octave below the
    smallest tried, within the paper's 2^-10 .. 2^2 (next None: bracketed, or
    at a bound)."""
    low, high = PAPER_LOG2_RANGE
    tried = sorted(round(math.log2(r["lr"])) for r in rows)
    trained = {round(math.log2(r["lr"])) for r in rows if r["mean"] is not None}
    if not trained:
        return None, (tried[0] - 1 if tried and tried[0] > low else None)
    edge = min(trained)
    for rate in tried:
        if rate > edge and rate not in trained:
            break
        edge = max(edge, rate)
    return edge, (edge + 1 if edge + 1 not in tried and edge < high else None)


def trained(run, chance):
    """A run trained by accuracy: it completed (no divergence) above `chance`."""
    return run["status"] == "completed" and run.get("test_top1") is not None and run["test_top1"] > chance


def wilson(k, n, z=Z95):
    """The Wilson score interval (Wilson 1927) of a fraction of k in n:
    (low, high), 95% by default; sound at k = 0 or n, where the normal
    approximation's is empty."""
    if n == 0:
        return 0.0, 1.0
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def welch(a, b, level=0.95):
    """Welch's interval for mean(a) - mean(b) (unequal variances, the
    Welch-Satterthwaite degrees of freedom): (difference, low, high), or
    None where a side has fewer than 2 values. Equal values on both sides
    give a zero-width interval."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or len(b) < 2:
        return None
    difference = float(a.mean() - b.mean())
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0:
        return difference, difference, difference
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    from scipy import stats  # a core dependency (setup.py), imported where a report compares

    half = float(stats.t.ppf((1 + level) / 2, df)) * math.sqrt(va + vb)
    return difference, difference - half, difference + half


def fisher_less(k, n, k_ref, n_ref):
    """One-sided Fisher exact p that k of n trained arose from a success
    rate no lower than k_ref of n_ref's: the hypergeometric chance of k or
    fewer of the k + k_ref successes falling among the first n runs."""
    total, successes = n + n_ref, k + k_ref
    return sum(math.comb(successes, i) * math.comb(total - successes, n - i)
               for i in range(max(0, n - (total - successes)), k + 1)) / math.comb(total, n)


def survival(runs, chance, loss_limit):
    """Per learning rate (ascending): of its runs, how many trained by
    accuracy (completed, test accuracy above `chance`) and by accuracy and
    loss (also a final training cross-entropy below `loss_limit`: a run whose
    loss never left ln(classes) can beat chance on the class prior alone),
    each with its Wilson interval."""
    marks = {}
    for run in runs:
        accuracy = trained(run, chance)
        loss = run.get("train_cross_entropy")
        both = accuracy and loss is not None and math.isfinite(loss) and loss < loss_limit
        marks.setdefault(lr_key(run["lr"]), []).append((accuracy, both))
    rows = []
    for lr, found in sorted(marks.items()):
        n, k, k_loss = len(found), sum(a for a, _ in found), sum(b for _, b in found)
        rows.append({"lr": lr, "runs": n, "trained": k, "interval": list(wilson(k, n)),
                     "trained_by_loss": k_loss, "interval_by_loss": list(wilson(k_loss, n))})
    return rows


def half_rate(log2_lrs, fractions):
    """The log2 rate where `fractions` (one per rate, rates ascending) first
    fall through 1/2 from a rate where at least half trained, linear in log2
    rate between the two grid points; None where they never do on the grid."""
    points = list(zip(log2_lrs, fractions))
    for (x0, f0), (x1, f1) in zip(points, points[1:]):
        if f0 >= 0.5 > f1:
            return x0 + (f0 - 0.5) / (f0 - f1) * (x1 - x0)
    return None


def half_rates(rows, by_loss=False):
    """`half_rate` of a cell's `survival` rows, and its interval: the same
    crossing of the intervals' lower and upper bounds (a pointwise band
    inverted, not an exact interval; None: beyond the grid's end)."""
    x = [math.log2(r["lr"]) for r in rows]
    trained, interval = ("trained_by_loss", "interval_by_loss") if by_loss else ("trained", "interval")
    return (half_rate(x, [r[trained] / r["runs"] for r in rows]), half_rate(x, [r[interval][0] for r in rows]),
            half_rate(x, [r[interval][1] for r in rows]))


def half_rate_draws(rows, by_loss=False, draws=4000, seed=0):
    """Draws of a cell's `half_rate` from the Jeffreys posterior of each
    rate's fraction (Beta(k + 1/2, n - k + 1/2), rates independent): a rate
    where 10 of 10 trained still may not, so a sharp fall has a width. A draw
    that never falls through 1/2 on the grid is +inf (half train above it)
    or -inf (below it)."""
    trained = "trained_by_loss" if by_loss else "trained"
    x = [math.log2(r["lr"]) for r in rows]
    k, n = np.array([r[trained] for r in rows], float), np.array([r["runs"] for r in rows], float)
    fractions = np.random.default_rng(seed).beta(k + 0.5, n - k + 0.5, size=(draws, len(rows)))
    out = np.empty(draws)
    for i, f in enumerate(fractions):
        half = half_rate(x, f)
        out[i] = half if half is not None else (math.inf if f[-1] >= 0.5 else -math.inf)
    return out


def half_rate_shift(rows, base_rows, by_loss=False, draws=4000, seed=0):
    """How far a factor moves the rate where half train, in octaves: the
    `half_rate` of `rows` minus that of `base_rows` (None where either is
    off its grid), and a 95% interval from the two cells' independent
    `half_rate_draws` (a bound None: beyond the grids; a draw off both grids
    on one side counts against both bounds)."""
    trained = "trained_by_loss" if by_loss else "trained"
    here, there = (half_rate([math.log2(r["lr"]) for r in c], [r[trained] / r["runs"] for r in c])
                   for c in (rows, base_rows))  # the counts alone: `half_rates` also needs each rate's interval
    shift = None if here is None or there is None else here - there
    with np.errstate(invalid="ignore"):  # inf - inf: unknown
        d = half_rate_draws(rows, by_loss, draws, seed) - half_rate_draws(base_rows, by_loss, draws, seed + 1)
    low = np.quantile(np.where(np.isnan(d), -np.inf, d), 0.025, method="inverted_cdf")
    high = np.quantile(np.where(np.isnan(d), np.inf, d), 0.975, method="inverted_cdf")
    return shift, (float(low) if np.isfinite(low) else None), (float(high) if np.isfinite(high) else None)


def base_lrs(settings, key, batch):
    """A cell's first grid: --lrs, or the octaves either side of the method's
    --centre_log2_lrs entry (--protocol=survival: seven rates half an octave
    apart around it), which is for --batch_size: a cell of batch size
    B is centred log2(B / batch_size) octaves higher (the optimal rate is
    proportional to the batch below the critical batch; SkipInit §3)."""
    if key in settings.centre_log2_lrs:
        centre = settings.centre_log2_lrs[key] + round(math.log2(batch / settings.batch_size))
        if settings.protocol == SURVIVAL:  # half-octave steps, 1.5 octaves either side
            return [2.0 ** (centre + k / 2) for k in range(-3, 4)]
        return [2.0**k for k in (centre - 1, centre, centre + 1)]
    return list(settings.lrs)


def cell_pending(settings, done, cell):
    """A cell's runs that can start now: the missing seeds of its grid (the
    base grid and the points an earlier extension added), else the next
    point of --extend_grid, else its final seeds at the best rate."""
    key, depth, batch = cell

    def missing(lrs, seeds, phase=SELECT):  # exact rates (2^-9 trains at 2^-9); `done` is keyed by `ident`
        return [(key, depth, batch, lr, seed, phase) for lr in lrs for seed in seeds
                if ident(key, depth, batch, lr, seed, phase) not in done]

    finals = range(settings.final_seed_start, settings.final_seed_start + settings.final_seeds)
    if key in settings.chosen_log2_lrs:  # no selection: the final runs at the given rate
        return missing([2.0 ** settings.chosen_log2_lrs[key]], finals, FINAL)
    base = base_lrs(settings, key, batch)
    keyed = {lr_key(lr) for lr in base}
    selection = in_cell(done.values(), cell, SELECT)
    searching = settings.extend_grid or settings.protocol == EDGE
    added = sorted({r["lr"] for r in selection if lr_key(r["lr"]) not in keyed}) if searching else []
    todo = missing(base + added, range(settings.seeds))
    if todo:
        return todo
    best, rows = summarize(selection, settings.best_k, settings.chance)
    if settings.protocol == EDGE:
        step = stability_edge(rows)[1]
        return missing([2.0**step], range(settings.seeds)) if step is not None else []
    if settings.extend_grid:
        step = next_log2_lr(best, rows)
        if step is not None:
            return missing([2.0**step], range(settings.seeds))
    if settings.final_seeds and best:
        return missing([best["lr"]], finals, FINAL)
    return []


def pending_runs(settings, done):
    """The runs that can start now, in the sweep's order, cell by cell, as
    (method, depth, batch_size, lr, seed, phase); a cell's later runs wait
    for the results of its earlier ones. `done` maps idents to recorded runs."""
    return [run for cell in cells(settings) for run in cell_pending(settings, done, cell)]


def runs_left(settings, done):
    """Runs still to come as far as known now: the pending ones, and the
    final seeds of cells still choosing their rate (a grid extension adds
    more when it happens)."""
    left = 0
    for cell in cells(settings):
        todo = cell_pending(settings, done, cell)
        left += len(todo)
        if settings.final_seeds and todo and todo[0][5] == SELECT:
            left += settings.final_seeds
    return left
