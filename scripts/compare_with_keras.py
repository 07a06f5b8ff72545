#!/usr/bin/env python3
"""Checks `bigbatch train` against TensorFlow/Keras 3 training docs/model.md's residual MLP.

The three recipes this project answers are Keras code; this script
trains the same MLP in Keras, on the same initial parameters, data and batch order as
`bigbatch train`, and compares the parameters after 20 optimizer steps.

Cases (each PASS or FAIL):
  full-sgd, full-adamw    the batch of 100 in one piece; SGD (lr 0.05, momentum 0.9,
                          coupled weight decay 1e-4) and AdamW (lr 1e-3, weight decay 1e-2)
  accum7-sgd, accum7-adamw
                          bigbatch --micro-batch 7 (which does not divide 100 or the
                          epoch's short last batch of 12) against a hand-written
                          GradientTape loop that sums micro-batch mean gradients, each
                          weighted by its sample count over the batch's
  builtin25-adamw, builtin25-sgd
                          bigbatch --micro-batch 25 --drop-last against Keras 3's own
                          `gradient_accumulation_steps=4` (it averages a fixed number of
                          apply() calls, so it needs equal micro-batches: see EVEN_MICRO)
Negative controls (each must land OUTSIDE its bound, else the script fails): the
recipe's naive accumulation (each uneven micro-batch's mean gradient averaged with equal
weights); Keras's own SGD `weight_decay` (decoupled) in place of the coupled decay of
torch.optim.SGD and bigbatch; and Keras's AdamW taken as it is.
Where Keras's optimizers differ from PyTorch's (which bigbatch follows), the Keras side is
made to compute PyTorch's update explicitly, and the script prints one line per
difference, naming the Keras function that shows it.

The bound of a case is derived, not guessed: the same Keras loop run in float64 is taken
as the exact result, the Keras float32 run's largest relative difference from it is the
case's NOISE, and bigbatch must lie within NOISE_FACTOR x NOISE of Keras float32 (see
NOISE_FACTOR below). Per case it prints, per tensor, the max abs and max relative
difference (relative to the tensor's largest magnitude) and the bound.

Run (TensorFlow's CPU build with Keras 3 in a virtual environment):
    scripts/keras-venv.sh    # build-keras-venv: tensorflow-cpu 2.21.0, keras 3.15.1, numpy
    build-keras-venv/bin/python scripts/compare_with_keras.py [--bigbatch build/chapters/cli/bigbatch]
or as the CTest test compare_with_keras (label "keras"), which runs build-keras-venv's
Python (.ci/run makes it; tests/CMakeLists.txt's BIGBATCH_KERAS_PYTHON names another).
It takes about 17 s on 2 cores (wall time, 3 s of it TensorFlow's import; measured with
tensorflow-cpu 2.21.0 and Keras 3.15.1 on a 2-core x86-64 with AVX-512). Where tensorflow,
keras (3 or later) or numpy cannot be imported it prints "SKIPPED: ..." and exits with 77
(CTest's SKIP_RETURN_CODE); it exits with 1 when any case or control fails.
"""
import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

STARTED = time.monotonic()
# 77: "skipped" to CTest (SKIP_RETURN_CODE) and to Automake alike.
EXIT_SKIPPED = 77

# GradientTape is TensorFlow's: pin Keras to that backend whatever ~/.keras/keras.json
# says, and keep TensorFlow's C++ start-up chatter off the report.
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:
    import numpy as np
    import tensorflow as tf
    import keras
except ImportError as error:
    print(f"SKIPPED: compare_with_keras.py needs numpy, tensorflow and keras, which "
          f"{sys.executable} cannot import ({error}); install them in a venv: python3 -m venv "
          "build-keras-venv with scripts/keras-venv.sh")
    sys.exit(EXIT_SKIPPED)
if int(keras.__version__.split(".")[0]) < 3:
    print(f"SKIPPED: compare_with_keras.py needs Keras 3 (gradient_accumulation_steps, "
          f"keras.ops); {sys.executable} has keras {keras.__version__}")
    sys.exit(EXIT_SKIPPED)

# Two threads inside an op, one op at a time (the CTest test reserves two cores). This
# must happen before TensorFlow runs its first op.
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(1)
IMPORTED = time.monotonic()

import safetensors_f32  # scripts/safetensors_f32.py: the format with numpy alone

ROOT = pathlib.Path(__file__).resolve().parent.parent

# ---- the problem ------------------------------------------------------------------------

N_SAMPLES, N_FEATURES, N_CLASSES = 512, 20, 5
DEPTH, HIDDEN, EXPANSION = 2, 16, 4
LAYER_NORM_EPS = 1e-5  # docs/model.md; Keras's LayerNormalization defaults to 1e-3
# 512 = 5 x 100 + 12: with --shuffle off every sixth step (steps 6, 12, 18 of 20) takes the
# epoch's short last batch of 12 samples, as bigbatch (and a DataLoader) cut it.
BATCH, STEPS = 100, 20
# 7 divides neither 100 (14 x 7 + 2) nor 12 (7 + 5): the weights n_m / N of the micro-
# batches are uneven in every step, which is what tells weighted and unweighted apart.
UNEVEN_MICRO = 7
# Keras's built-in accumulation counts apply() calls; it averages them correctly only for
# equal micro-batches: 25 divides 100, and --drop-last removes the short batch of 12.
EVEN_MICRO = 25

SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
ADAMW = dict(lr=1e-3, beta_1=0.9, beta_2=0.999, eps=1e-8, weight_decay=1e-2)  # PyTorch's
SGD_FLAGS = ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-4"]
ADAMW_FLAGS = ["--optimizer", "adamw", "--lr", "0.001", "--weight-decay", "1e-2"]

# ---- the pass/fail rule -------------------------------------------------------------------
#
# bigbatch and TensorFlow both compute in float32 but round differently (oneDNN's and
# bigbatch's GEMMs sum in other orders; LayerNorm, GELU and the optimizers' formulas are
# written differently), so the two cannot agree bit for bit; what they can be held to is
# the size of fp32 rounding after 20 steps of this model. NOISE measures that size: the
# largest relative difference between the Keras float32 run and the very same Keras loop
# in float64 (the float64 run stands in for the exact result). If bigbatch's rounding were
# exactly as large as TensorFlow's, the two float32 runs would lie within 2 x NOISE of
# each other (each NOISE from the exact result); the factor 10 leaves bigbatch room to
# round up to ~5 times worse than TensorFlow (another summation order in a long dot
# product, a chain of roundings through Adam's division), which no one can bound in
# advance for 20 steps of training: the factor is EMPIRICAL. Measured (tensorflow-cpu
# 2.21.0, Keras 3.15.1, 2-core x86-64 with AVX-512; the runs are deterministic): NOISE is
# 3.9e-7 to 8.2e-7, and bigbatch lands at 0.95 to 3.44 x NOISE in the six cases, inside the
# bound by 2.9x or more; the controls land 145 x (Keras's decoupled SGD decay), 815 x
# (Keras's AdamW as it is) and 35600 x (naive accumulation) outside it, and slips planted
# in this script's Keras side (LayerNorm eps 1e-3, Keras's default; the erf GELU; the
# epoch's short batch dropped) at 900 x NOISE or more. What the bound cannot resolve: the
# float32 betas in Keras's bias correction left uncompensated (keras_adamw_settings) land
# at 9 to 12 x NOISE, at the bound, which is why they are matched and not a control.
# The float64 run is not exactly PyTorch's float64 either: tf.nn.gelu casts its 0.044715
# through float32 (tensorflow/python/ops/nn_ops.py: gelu), which leaves Keras's float64
# runs 1.0e-9 (SGD) and 1.6e-9 (AdamW) relative off torch.optim's (PyTorch 1.13, checked
# once, outside this script): under 0.5% of NOISE.
NOISE_FACTOR = 10.0
# If NOISE were ever tiny (a step that happens to round alike), the bound would not drop
# below 8 fp32 units in the last place (8 x 2^-23 ~ 1e-6) relative to a tensor's largest
# entry: less would demand bit-equality of two different implementations.
BOUND_FLOOR = 8 * 2.0 ** -23


# ---- data and initial parameters ---------------------------------------------------------

def make_data():
    """Gaussian blobs: class c's samples scattered (sd 1.5) around a random centre."""
    rng = np.random.default_rng(2024)
    centres = rng.normal(size=(N_CLASSES, N_FEATURES))
    labels = rng.permutation(np.arange(N_SAMPLES) % N_CLASSES).astype(np.int64)
    features = centres[labels] + 1.5 * rng.normal(size=(N_SAMPLES, N_FEATURES))
    return features.astype(np.float32), labels


def parameter_shapes():
    """docs/model.md's parameters, in PyTorch's layout ([out, in] weights) and order."""
    shapes = {"stem.weight": (HIDDEN, N_FEATURES), "stem.bias": (HIDDEN,)}
    for i in range(DEPTH):
        shapes.update({f"blocks.{i}.ln.weight": (HIDDEN,), f"blocks.{i}.ln.bias": (HIDDEN,),
                       f"blocks.{i}.fc1.weight": (EXPANSION * HIDDEN, HIDDEN),
                       f"blocks.{i}.fc1.bias": (EXPANSION * HIDDEN,),
                       f"blocks.{i}.fc2.weight": (HIDDEN, EXPANSION * HIDDEN),
                       f"blocks.{i}.fc2.bias": (HIDDEN,)})
    shapes.update({"head.weight": (N_CLASSES, HIDDEN), "head.bias": (N_CLASSES,),
                   "head.ln.weight": (HIDDEN,), "head.ln.bias": (HIDDEN,)})
    return shapes


def make_init():
    """nn.Linear's default ranges (U(+-1/sqrt(fan_in)) for weight and bias), LayerNorm 1, 0."""
    rng = np.random.default_rng(7)
    state = {}
    for name, shape in parameter_shapes().items():
        if ".ln." in name:
            state[name] = np.full(shape, 1.0 if name.endswith("weight") else 0.0, np.float32)
        else:
            fan_in = parameter_shapes()[name.rsplit(".", 1)[0] + ".weight"][1]
            limit = 1.0 / math.sqrt(fan_in)
            state[name] = rng.uniform(-limit, limit, size=shape).astype(np.float32)
    return state


def batch_rows(step, drop_last=False):
    """Sample indices of optimizer step `step` (from 0) under --shuffle off: each epoch is
    cut in order into batches of BATCH, the last one short (or dropped with --drop-last),
    and a batch never runs into the next epoch."""
    per_epoch = N_SAMPLES // BATCH if drop_last else -(-N_SAMPLES // BATCH)
    start = (step % per_epoch) * BATCH
    return np.arange(start, min(start + BATCH, N_SAMPLES))


# ---- the model in Keras ---------------------------------------------------------------------

class KerasMLP:
    """docs/model.md's MLP from Keras 3 layers, in one dtype:
        h = gelu(stem(x));  h = h + fc2(gelu(fc1(ln(h)))) per block;  logits = head(head.ln(h))
    GELU is keras.ops.gelu(approximate=True), the tanh form: keras.activations.gelu (what
    Dense(activation="gelu") uses) defaults to approximate=False, the erf form. Dropout is 0
    in every run here, so the model has no Dropout layers."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.layers = {}  # PyTorch module name -> Keras layer

        def dense(name, units, inputs):
            layer = keras.layers.Dense(units, dtype=dtype, name=name.replace(".", "_"))
            layer.build((None, inputs))
            self.layers[name] = layer

        def norm(name):
            layer = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPS, dtype=dtype,
                                                    name=name.replace(".", "_"))
            layer.build((None, HIDDEN))
            self.layers[name] = layer

        dense("stem", HIDDEN, N_FEATURES)
        for i in range(DEPTH):
            norm(f"blocks.{i}.ln")
            dense(f"blocks.{i}.fc1", EXPANSION * HIDDEN, HIDDEN)
            dense(f"blocks.{i}.fc2", HIDDEN, EXPANSION * HIDDEN)
        norm("head.ln")
        dense("head", N_CLASSES, HIDDEN)
        # PyTorch name -> (Keras variable, whether it is a Dense kernel). A Dense kernel is
        # [in, out] and computes x @ kernel; nn.Linear's weight is [out, in] and computes
        # x @ weight^T: the kernel is the TRANSPOSE of the safetensors tensor.
        self.parameters = {}
        for name in parameter_shapes():
            module, kind = name.rsplit(".", 1)
            layer = self.layers[module]
            if isinstance(layer, keras.layers.Dense):
                variable = layer.kernel if kind == "weight" else layer.bias
            else:
                variable = layer.gamma if kind == "weight" else layer.beta
            self.parameters[name] = (variable, isinstance(layer, keras.layers.Dense)
                                     and kind == "weight")
        self.variables = [variable for variable, _ in self.parameters.values()]
        # The loss in the model's dtype: a keras.losses.Loss computes in backend.floatx()
        # (float32) unless told otherwise and would cast float64 logits down to float32
        # (keras/src/losses/loss.py: Loss.__call__ converts y_pred to self.dtype).
        # Its default reduction, sum_over_batch_size, is the mean over the samples given.
        self.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype=dtype)
        # One traced function per model (the rows dimension is left open, so micro-batches
        # of every size share the trace): mean loss of the rows given and its gradients.
        self.mean_loss_and_gradients = tf.function(self._mean_loss_and_gradients,
                                                   input_signature=[
                                                       tf.TensorSpec([None, N_FEATURES], dtype),
                                                       tf.TensorSpec([None], tf.int64)])

    def __call__(self, x):
        gelu = lambda t: keras.ops.gelu(t, approximate=True)
        h = gelu(self.layers["stem"](x))
        for i in range(DEPTH):
            inner = self.layers[f"blocks.{i}.fc1"](self.layers[f"blocks.{i}.ln"](h))
            h = h + self.layers[f"blocks.{i}.fc2"](gelu(inner))
        return self.layers["head"](self.layers["head.ln"](h))

    def _mean_loss_and_gradients(self, x, y):
        with tf.GradientTape() as tape:
            loss = self.loss(y, self(x))
        return loss, tape.gradient(loss, self.variables)

    def load(self, state):
        for name, (variable, transposed) in self.parameters.items():
            value = state[name].T if transposed else state[name]
            variable.assign(value.astype(self.dtype))

    def state(self):
        """The parameters in PyTorch's names and layout, as float64 numpy arrays."""
        return {name: (variable.numpy().T if transposed else variable.numpy()).astype(np.float64)
                for name, (variable, transposed) in self.parameters.items()}


# ---- optimizers: Keras's, made to compute PyTorch's (bigbatch's) update ----------------------

def keras_optimizer(kind, dtype, accumulation_steps=None, decoupled_sgd_decay=False):
    """A Keras optimizer for `kind` ("sgd" or "adamw"), its hyperparameter variables in
    `dtype` (Keras keeps the learning rate as a variable of backend.floatx(): under float32
    the float64 reference would run at float32(0.05))."""
    previous = keras.config.floatx()
    keras.config.set_floatx(dtype)
    try:
        if kind == "sgd":
            # Keras SGD's weight_decay is decoupled (w -= lr wd w, outside the momentum);
            # torch.optim.SGD's is coupled (g += wd w, through the momentum): we pass no
            # weight_decay and add wd w to the gradient ourselves (add_coupled_decay),
            # unless this is the control that uses Keras's own.
            optimizer = keras.optimizers.SGD(
                learning_rate=SGD["lr"], momentum=SGD["momentum"],
                weight_decay=SGD["weight_decay"] if decoupled_sgd_decay else None,
                gradient_accumulation_steps=accumulation_steps)
            # SGD.update_step multiplies by ops.cast(self.momentum, variable.dtype), and
            # TensorFlow casts a Python float through float32: the float64 run would use
            # momentum 0.89999997615814209 (measured: 1.6e-7 relative off torch.optim.SGD in
            # float64 after 20 steps, 0.4 x NOISE). A float64 tensor is cast exactly. (The
            # constructor insists on a Python float, hence the assignment after it.)
            if dtype == "float64":
                optimizer.momentum = tf.constant(SGD["momentum"], tf.float64)
            return optimizer
        # Keras's AdamW decays like PyTorch's (w -= lr wd w, before the Adam step); its
        # learning rate, epsilon and weight decay are set before every step
        # (keras_adamw_settings) so that it computes PyTorch's update.
        return keras.optimizers.AdamW(
            learning_rate=ADAMW["lr"], beta_1=ADAMW["beta_1"], beta_2=ADAMW["beta_2"],
            epsilon=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
            gradient_accumulation_steps=accumulation_steps)
    finally:
        keras.config.set_floatx(previous)


def keras_beta(beta, dtype):
    """The beta Keras's Adam.update_step raises to the power t in `dtype`: it takes
    ops.cast(self.beta_1, variable.dtype), and TensorFlow's cast of a Python float goes
    through float32 (with this TensorFlow, tf.cast(0.999, tf.float64) is 0.99900001287...,
    in float64 runs too). Asked of Keras itself, so that a Keras that casts exactly is
    matched too."""
    return float(keras.ops.convert_to_numpy(keras.ops.cast(beta, dtype)))


def keras_adamw_settings(step, dtype, matched=True):
    """(learning_rate, epsilon, weight_decay) to give Keras's AdamW before optimizer step
    `step` (from 1) so that it computes PyTorch's (and bigbatch's) update. Keras's
    Adam.update_step (keras/src/optimizers/adam.py) computes
        w -= lr sqrt(1 - B2^t) / (1 - B1^t) * m / (sqrt(v) + eps_keras)
    with B1, B2 the betas as Keras casts them (keras_beta); PyTorch computes, its bias corrections in
    double from the exact betas b1, b2,
        w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
         = lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps sqrt(1 - b2^t)).
    So eps_keras = eps sqrt(1 - b2^t): Keras adds epsilon to the sqrt of the UNcorrected
    second moment, a different value every step; and lr_keras = lr times the ratio of the
    two bias-correction factors (1 + 6.4e-6 at t = 1 here: small, but 9 x NOISE after 20
    steps, measured). Both optimizers decay by lr * wd * w before the Adam step
    (base_optimizer.py: BaseOptimizer._apply_weight_decay), so wd_keras = wd lr / lr_keras
    keeps that product PyTorch's. matched=False: Keras's AdamW taken as it is, the
    negative control."""
    lr, eps, wd = ADAMW["lr"], ADAMW["eps"], ADAMW["weight_decay"]
    if not matched:
        return lr, eps, wd
    exact = math.sqrt(1 - ADAMW["beta_2"] ** step) / (1 - ADAMW["beta_1"] ** step)
    beta_1, beta_2 = keras_beta(ADAMW["beta_1"], dtype), keras_beta(ADAMW["beta_2"], dtype)
    keras_factor = math.sqrt(1 - beta_2 ** step) / (1 - beta_1 ** step)
    lr_keras = lr * exact / keras_factor
    return lr_keras, eps * math.sqrt(1 - ADAMW["beta_2"] ** step), wd * lr / lr_keras


def add_coupled_decay(gradients, variables):
    """torch.optim.SGD's weight decay: g + wd w, before the momentum."""
    return [g + SGD["weight_decay"] * v for g, v in zip(gradients, variables)]


# ---- the Keras training loops -------------------------------------------------------------

def train_keras(model, init, features, labels, kind, accumulation="none", micro=None,
                matched_adamw=True, decoupled_sgd_decay=False):
    """STEPS optimizer steps of `kind` on the --shuffle off batches; returns the parameters
    (PyTorch layout, float64) and each step's loss (the batch's mean cross-entropy).
    accumulation:
      "none"      the batch in one GradientTape
      "weighted"  micro-batches of `micro` rows; gradient = sum_m (n_m / N) mean-gradient_m
      "naive"     the control: gradient = (1 / M) sum_m mean-gradient_m (equal weights)
      "builtin"   Keras's gradient_accumulation_steps = BATCH / micro, one apply() per
                  micro-batch, batches of --drop-last"""
    model.load(init)
    x_all = tf.constant(features.astype(model.dtype))
    y_all = tf.constant(labels)
    builtin = accumulation == "builtin"
    optimizer = keras_optimizer(kind, model.dtype, BATCH // micro if builtin else None,
                                decoupled_sgd_decay)
    losses = []
    for step in range(STEPS):
        rows = batch_rows(step, drop_last=builtin)
        if kind == "adamw":
            lr, optimizer.epsilon, optimizer.weight_decay = keras_adamw_settings(
                step + 1, model.dtype, matched_adamw)
            optimizer.learning_rate = lr
        if accumulation == "none":
            loss, gradients = model.mean_loss_and_gradients(tf.gather(x_all, rows),
                                                            tf.gather(y_all, rows))
            losses.append(float(loss))
        else:
            pieces = [rows[i:i + micro] for i in range(0, len(rows), micro)]
            total, step_loss = None, 0.0
            for piece in pieces:
                loss, gradients = model.mean_loss_and_gradients(tf.gather(x_all, piece),
                                                                tf.gather(y_all, piece))
                step_loss += float(loss) * len(piece) / len(rows)
                if builtin:
                    if kind == "sgd":  # wd w in each of the K calls: their mean has wd w
                        gradients = add_coupled_decay(gradients, model.variables)
                    optimizer.apply(gradients, model.variables)
                    continue
                weight = len(piece) / len(rows) if accumulation == "weighted" else 1 / len(pieces)
                scaled = [g * tf.constant(weight, model.dtype) for g in gradients]
                total = scaled if total is None else [a + b for a, b in zip(total, scaled)]
            losses.append(step_loss)
            if builtin:
                continue
            gradients = total
        if kind == "sgd" and not decoupled_sgd_decay:
            gradients = add_coupled_decay(gradients, model.variables)
        optimizer.apply(gradients, model.variables)
    # With accumulation Keras counts optimizer steps as apply() calls // the steps to
    # accumulate (BaseOptimizer.iterations), which its Adam's bias correction reads.
    if int(optimizer.iterations) != STEPS:
        raise RuntimeError(f"Keras's optimizer counted {int(optimizer.iterations)} steps, "
                           f"not {STEPS}")
    return model.state(), losses


# ---- bigbatch -----------------------------------------------------------------------------

def train_bigbatch(binary, folder, tag, optimizer_flags, micro, drop_last=False):
    out, log = folder / f"{tag}.safetensors", folder / f"{tag}.jsonl"
    command = [str(binary), "train", "--data", f"npy:{folder / 'X.npy'},{folder / 'y.npy'}",
               "--init", str(folder / "init.safetensors"), "--save", str(out), "--log", str(log),
               "--shuffle", "off", "--batch", str(BATCH), "--micro-batch", str(micro),
               "--steps", str(STEPS), "--depth", str(DEPTH), "--hidden", str(HIDDEN),
               "--expansion", str(EXPANSION), "--norm", "layer", "--activation", "gelu",
               "--dropout", "0", "--seed", "0", "--device", "cpu", *optimizer_flags]
    if drop_last:
        command.append("--drop-last")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}:\n"
                           f"{done.stdout}{done.stderr}")
    state = {k: v.astype(np.float64) for k, v in safetensors_f32.read(out).items()}
    losses = [json.loads(line)["loss"] for line in log.read_text().splitlines()]
    return state, losses, " ".join(command[2:])


# ---- comparison ---------------------------------------------------------------------------

def relative(a, b):
    """max |a - b| over the tensor / max |b| (1 when b is all zeros)."""
    return float(np.max(np.abs(a - b))) / (float(np.max(np.abs(b))) or 1.0)


def worst(states, reference):
    return max(relative(states[name], reference[name]) for name in reference)


def table(candidate, reference, bound):
    """Prints each tensor's max abs and max relative difference; returns the largest
    relative one (inf when the names or shapes disagree)."""
    if set(candidate) != set(reference):
        print(f"  tensor names differ: {sorted(set(candidate) ^ set(reference))}")
        return math.inf
    print(f"  {'tensor':24s} {'shape':>7s} {'max abs diff':>13s} {'max rel diff':>13s}")
    largest = 0.0
    for name, expected in reference.items():
        if candidate[name].shape != expected.shape:
            print(f"  {name}: shape {candidate[name].shape}, expected {expected.shape}")
            return math.inf
        rel = relative(candidate[name], expected)
        largest = max(largest, rel)
        mark = "  <-- over the bound" if rel > bound else ""
        print(f"  {name:24s} {'x'.join(map(str, expected.shape)):>7s} "
              f"{np.max(np.abs(candidate[name] - expected)):13.3e} {rel:13.3e}{mark}")
    return largest


def bound_of(keras32, keras64):
    noise = worst(keras32, keras64)
    return noise, max(NOISE_FACTOR * noise, BOUND_FLOOR)


def judge_case(tag, what, command, candidate, losses, keras32, losses32, keras64, init):
    """bigbatch against Keras float32; True for PASS."""
    noise, bound = bound_of(keras32, keras64)
    print(f"\n== {tag}: {what} ==\n  bigbatch {command}")
    largest = table(candidate, keras32, bound)
    gap = max(abs(a - b) for a, b in zip(losses, losses32))
    print(f"  loss: step 1 {losses32[0]:.6f} (Keras) {losses[0]:.6f} (bigbatch); step {STEPS} "
          f"{losses32[-1]:.6f} / {losses[-1]:.6f}; max |diff| over the steps {gap:.2e}")
    print(f"  NOISE (Keras fp32 vs the same loop in float64) {noise:.3e}; bigbatch vs float64 "
          f"{worst(candidate, keras64):.3e}; the parameters moved {worst(keras32, init):.3e} "
          "from init (max rel)")
    ok = largest <= bound and len(losses) == STEPS
    print(f"  bigbatch vs Keras fp32: max rel {largest:.3e} = {largest / noise:.2f} x NOISE; "
          f"bound {NOISE_FACTOR:g} x NOISE = {bound:.3e} -> {'PASS' if ok else 'FAIL'}")
    return ok


def judge_control(tag, what, control, keras32, keras64):
    """A slip that must land outside the bound of the case it imitates; True when it does."""
    noise, bound = bound_of(keras32, keras64)
    print(f"\n== control {tag}: {what} ==")
    largest = table(control, keras32, bound)
    detected = largest > bound
    print(f"  control vs the matched Keras fp32 run: max rel {largest:.3e} = "
          f"{largest / bound:.1f} x the bound {bound:.3e} -> "
          f"{'outside the bound, as it must be: PASS' if detected else 'NOT detected: FAIL'}")
    return detected


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bigbatch", default=str(ROOT / "build/chapters/cli/bigbatch"),
                        help="the bigbatch binary (default: build/chapters/cli/bigbatch)")
    args = parser.parse_args()
    binary = pathlib.Path(args.bigbatch)
    if not binary.is_file():
        sys.exit(f"{binary}: no such file; build it: cmake --build build --target bigbatch")

    print(f"tensorflow {tf.__version__}, keras {keras.__version__} (backend "
          f"{keras.backend.backend()}), numpy {np.__version__}; TensorFlow threads: 2 intra-op, "
          f"1 inter-op; import took {IMPORTED - STARTED:.1f} s")
    print(f"data {N_SAMPLES} x {N_FEATURES}, {N_CLASSES} classes; MLP depth {DEPTH}, hidden "
          f"{HIDDEN}, expansion {EXPANSION}, LayerNorm eps {LAYER_NORM_EPS:g}, GELU tanh, "
          f"dropout 0; batch {BATCH}, {STEPS} steps, --shuffle off")
    print("Where Keras differs from PyTorch (and bigbatch), matched here (files under keras/src/):")
    print("  AdamW epsilon: Keras adds it to sqrt(v) before the bias correction "
          "(optimizers/adam.py: Adam.update_step), PyTorch to sqrt(v / (1 - b2^t)): Keras's "
          "epsilon is set to 1e-8 * sqrt(1 - 0.999^t) before step t")
    print("  AdamW bias correction: Keras raises ops.cast(beta, dtype) to the power t, and the "
          f"cast goes through float32 (beta_2 {keras_beta(ADAMW['beta_2'], 'float64'):.12g} in "
          "float64), PyTorch uses the double betas: "
          "Keras's learning rate is scaled by the ratio of the two factors each step (and its "
          "weight_decay by the inverse, so lr * wd stays 1e-5)")
    print("  SGD weight decay: Keras's is decoupled, w -= lr*wd*w outside the momentum "
          "(optimizers/base_optimizer.py: BaseOptimizer._apply_weight_decay), PyTorch's coupled, "
          "g += wd*w: Keras gets no weight_decay and wd*w is added to the gradient")
    print("  SGD momentum: Keras v = m*v - lr*g, w += v (optimizers/sgd.py: SGD.update_step), "
          "PyTorch buf = m*buf + g, w -= lr*buf: v = -lr*buf while lr is constant, as here, so "
          "Keras's rule is used as it is; in float64 its momentum is a float64 tensor (the "
          "cast of 0.9 goes through float32)")
    print("  built-in accumulation: Keras sums the gradients of gradient_accumulation_steps "
          "apply() calls and divides by their number (optimizers/base_optimizer.py: "
          "BaseOptimizer._backend_apply_gradients): an unweighted mean over calls, right only "
          f"for equal micro-batches; used with micro-batches of {EVEN_MICRO} and --drop-last")
    print("  layers and loss: LayerNormalization's epsilon defaults to 1e-3 (set to 1e-5); "
          "keras.activations.gelu defaults to approximate=False, the erf form (keras.ops.gelu "
          "with approximate=True is used); a Loss computes in floatx (float32) unless given "
          "a dtype (losses/loss.py: Loss.__call__), so the float64 model passes dtype; Dense "
          "kernels are nn.Linear weights transposed")

    features, labels = make_data()
    init = make_init()
    models = {"float32": KerasMLP("float32"), "float64": KerasMLP("float64")}
    failures = []
    with tempfile.TemporaryDirectory(prefix="bigbatch-vs-keras-") as name:
        folder = pathlib.Path(name)
        np.save(folder / "X.npy", features)
        np.save(folder / "y.npy", labels)
        safetensors_f32.write(folder / "init.safetensors", init)
        # Keras starts from the file bigbatch reads, read back, not from the arrays above.
        init = {k: v for k, v in safetensors_f32.read(folder / "init.safetensors").items()}
        init64 = {k: v.astype(np.float64) for k, v in init.items()}

        def keras_pair(kind, **options):
            return [train_keras(models[dtype], init, features, labels, kind, **options)
                    for dtype in ("float32", "float64")]

        cases = [
            # tag, description, optimizer, bigbatch flags and micro-batch, Keras loop options
            ("full-sgd", "batch in one piece, SGD momentum 0.9, coupled decay 1e-4", "sgd",
             SGD_FLAGS, BATCH, False, dict()),
            ("full-adamw", "batch in one piece, AdamW", "adamw", ADAMW_FLAGS, BATCH, False,
             dict()),
            ("accum7-sgd", f"--micro-batch {UNEVEN_MICRO} vs a GradientTape loop weighting "
             "each micro-batch by n_m / N, SGD", "sgd", SGD_FLAGS, UNEVEN_MICRO, False,
             dict(accumulation="weighted", micro=UNEVEN_MICRO)),
            ("accum7-adamw", f"--micro-batch {UNEVEN_MICRO} vs a GradientTape loop weighting "
             "each micro-batch by n_m / N, AdamW", "adamw", ADAMW_FLAGS, UNEVEN_MICRO, False,
             dict(accumulation="weighted", micro=UNEVEN_MICRO)),
            ("builtin25-adamw", f"--micro-batch {EVEN_MICRO} --drop-last vs Keras's "
             f"gradient_accumulation_steps={BATCH // EVEN_MICRO}, AdamW", "adamw", ADAMW_FLAGS,
             EVEN_MICRO, True, dict(accumulation="builtin", micro=EVEN_MICRO)),
            ("builtin25-sgd", f"--micro-batch {EVEN_MICRO} --drop-last vs Keras's "
             f"gradient_accumulation_steps={BATCH // EVEN_MICRO}, SGD", "sgd", SGD_FLAGS,
             EVEN_MICRO, True, dict(accumulation="builtin", micro=EVEN_MICRO)),
        ]
        runs = {}
        for tag, what, kind, flags, micro, drop_last, options in cases:
            (k32, l32), (k64, _) = keras_pair(kind, **options)
            runs[tag] = (k32, k64)
            state, losses, command = train_bigbatch(binary, folder, tag, flags, micro, drop_last)
            if not judge_case(tag, what, command, state, losses, k32, l32, k64, init64):
                failures.append(tag)

        # Negative controls: slips the comparison exists to catch, each judged by the bound
        # of the case it imitates; each must land OUTSIDE it.
        naive, _ = train_keras(models["float32"], init, features, labels, "sgd",
                               accumulation="naive", micro=UNEVEN_MICRO)
        if not judge_control("naive-accumulation", f"micro-batches of {UNEVEN_MICRO}, each "
                             "one's mean gradient averaged with EQUAL weights (the recipe's "
                             "accumulation), SGD; judged by accum7-sgd's bound",
                             naive, *runs["accum7-sgd"]):
            failures.append("control naive-accumulation")
        decoupled, _ = train_keras(models["float32"], init, features, labels, "sgd",
                                   decoupled_sgd_decay=True)
        if not judge_control("keras-sgd-weight-decay", "Keras's SGD(weight_decay=1e-4), "
                             "decoupled, in place of the coupled decay; judged by full-sgd's "
                             "bound", decoupled, *runs["full-sgd"]):
            failures.append("control keras-sgd-weight-decay")

        as_is, _ = train_keras(models["float32"], init, features, labels, "adamw",
                               matched_adamw=False)
        if not judge_control("keras-adamw-as-is", "Keras's AdamW(learning_rate=1e-3, "
                             "epsilon=1e-8, weight_decay=1e-2) as it is, without the per-step matching: "
                             "epsilon added to sqrt(v) before the bias correction, the bias "
                             "corrections from float32 betas; judged by full-adamw's bound", as_is, *runs["full-adamw"]):
            failures.append("control keras-adamw-as-is")

    print(f"\ntotal time {time.monotonic() - STARTED:.1f} s")
    if failures:
        print(f"FAIL: {', '.join(failures)}")
        return 1
    print(f"PASS: all {len(cases)} cases, and the 3 negative controls outside their bounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
