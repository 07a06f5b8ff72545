#!/usr/bin/env python3
"""Runs the Keras recipes this project answers beside the large batch and measures each fault.

The project started from three question-and-answer texts (in Chinese) that give TensorFlow/
Keras code for a large batch on one GPU: 000 (gradient accumulation as a GradientTape loop
and as a @tf.function decorator; mixed_float16 with LossScaleOptimizer), 001 (accumulation
into tf.Variable buffers; "selective gradient checkpointing" by setting an attribute on
layers) and 004 (a custom loop combining accumulation with loss scaling). This script
writes each recipe's logic again (its arithmetic and control flow, not its text), with the
fewest changes that let it run under TensorFlow 2.21 / Keras 3 (listed in CHANGES below and
printed), on docs/model.md's MLP and the data of compare_with_keras.py, and measures:

  Q1 mean or sum: is the applied update the large batch's? (parameters after the run
     against the large batch, in units of NOISE; and the applied gradient itself)
  Q2 schedule: does the update fire when the recipe claims? (updates counted against
     the intended count; what a Python counter or attribute does inside tf.function)
  Q3 uneven micro-batches: is the epoch's short last micro-batch weighted by its rows?
  Q4 leftover: micro-batches at an epoch's end that do not fill a window: dropped,
     carried into the next epoch, or applied?
  Q5 001's checkpointing by attribute: does it recompute anything? (ops in the traced
     gradient graph, against tf.recompute_grad and keras.RematScope, which do)
  Q6 loss scaling (000, 004): where is the scale updated, and what happens when one
     micro-batch overflows? (scale sequence and skipped steps against "skip the whole
     step, halve once", PyTorch's GradScaler and chapter 04's rule)
  Q7 the corrected loop (micro-batch mean gradients weighted by rows / window rows, an
     explicit counter, the epoch's leftover applied as the short last step, the loss
     scale checked and updated once per step): equal to the large batch within the bound,
     and bigbatch --micro-batch equal to it within compare_with_keras.py's bound.

The bound is compare_with_keras.py's (bound_of): NOISE is the largest relative parameter
difference between the Keras float32 large-batch run and the same run in float64, and a
result is "the large batch's" when it lies within max(10 x NOISE, 8 fp32 ulps) of the
float32 run. The recipes' faults are expected findings; each is a claim this script checks,
and it exits 1 when a claimed fault disappears (e.g. the naive loop equals the large batch)
or when the corrected loop misses its bound.

Optimizer: the recipes use Adam, which divides the gradient by its own running scale, so a
gradient N times too large moves Adam's parameters little (only through epsilon). The
faults are measured with SGD (lr 0.05, momentum 0.9, no weight decay: compare_with_keras.py's
hyperparameters) where the step is proportional to the gradient; 001's sum is also run with
the recipe's Adam to show how much of it Adam hides.

Run (the venv of compare_with_keras.py):
    build-keras-venv/bin/python scripts/keras_recipes.py [--bigbatch build/chapters/cli/bigbatch]
        [--out recipes.json]
TensorFlow runs on one thread (intra-op 1, inter-op 1); about 55 s (tensorflow-cpu 2.21.0,
Keras 3.15.1, a 2-core x86-64 with AVX-512 shared with another job, load average 4 to 6), a
fifth of it 004's traces (one per value of its Python counter, about a second each). Two
runs write byte-identical JSON. Exit 77 with a SKIPPED line where numpy, tensorflow or
keras 3 cannot be imported; 1 when a claim or a corrected loop fails.
"""
import argparse
import hashlib
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

STARTED = time.monotonic()
EXIT_SKIPPED = 77
sys.dont_write_bytecode = True  # importing compare_with_keras must leave scripts/ as it is

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:
    import numpy as np
    import tensorflow as tf
    import keras
except ImportError as error:
    print(f"SKIPPED: keras_recipes.py needs numpy, tensorflow and keras 3, which "
          f"{sys.executable} cannot import ({error}); see compare_with_keras.py for the venv")
    sys.exit(EXIT_SKIPPED)
if int(keras.__version__.split(".")[0]) < 3:
    print(f"SKIPPED: keras_recipes.py needs Keras 3; {sys.executable} has keras {keras.__version__}")
    sys.exit(EXIT_SKIPPED)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import compare_with_keras as cwk  # sets 2 intra-op threads at import; no op has run yet

# One thread (a second job may hold the other cores); must precede TensorFlow's first op.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
IMPORTED = time.monotonic()

ROOT = pathlib.Path(__file__).resolve().parent.parent

# ---- the runs' shapes --------------------------------------------------------------------
# Data: compare_with_keras.py's 512 samples in their order (no shuffle), cut into micro-
# batches as tf.data's .batch(m) would (the last one short). A "window" is the N micro-
# batches one optimizer step should see; the large batch is N x m rows.
EVEN = dict(rows=500, micro=25)     # 20 micro-batches of 25: windows of 2 or 4 all full
UNEVEN = dict(rows=512, micro=22)   # 23 x 22 + 6: 24 micro-batches, the last of 6 rows;
#                                     24 is a multiple of 2 and 4: no leftover, only the short one
LEFT = dict(rows=500, micro=20)     # 25 micro-batches of 20: one left over for windows of 2 or 4
FULL = dict(rows=512, micro=25)     # compare_with_keras.py's data: 20 x 25 + 12; batch 100
POISON_FACTOR = 1e5                 # x a micro-batch's inputs: the fp16 stem output overflows
POISON_AT = 5                       # ... of the 6th micro-batch (0-based 5) of the first epoch
Q6_START_LOG2 = 20                  # a start scale above what this model's fp16 backward survives
SHORT = dict(rows=200, micro=25)    # 8 micro-batches: 004 traced as written (a trace per counter)

CHANGES = [
    # (recipe, original construct, replacement, why)
    ("all", "build_your_large_model() / ResNet50 / Sequential(Dense 256, 128, 10 softmax)",
     "compare_with_keras.KerasMLP (docs/model.md's MLP, 20 -> 5 classes, logits), called as "
     "model(x, training=True) through a 3-line adapter that also gives model.trainable_variables",
     "the task: the MLP and data of compare_with_keras.py; the ResNet is out of scope"),
    ("all", "CategoricalCrossentropy() / SparseCategoricalCrossentropy() / "
     "sparse_categorical_crossentropy(labels, predictions) on softmax outputs",
     "the same loss with from_logits=True (sparse: labels are class ids)",
     "the MLP returns logits, not probabilities; same mean (000, 001) or per-sample (004) "
     "cross-entropy"),
    ("all", "train_dataset (tf.data) / train_dataset.batch(MICRO_BATCH_SIZE)",
     "a Python iterable of (x, y) micro-batch tensors in data order, the last one short, "
     "as .batch(m) cuts them",
     "keeps TensorFlow on one thread and the order fixed (tf.data has its own thread pool)"),
    ("all", "tf.keras.optimizers.Adam()",
     "SGD(lr 0.05, momentum 0.9) for the fault measurements; the recipe's Adam() also run for "
     "001's Q1",
     "Adam normalises the gradient's scale: a sum in place of a mean hardly shows"),
    ("all", "print(...) of losses", "omitted; observe() added after each micro-batch",
     "observe() only reads the optimizer's counters, the loss scale and the parameters"),
    ("000", "the decorator's optimizer, built by its first apply_gradients inside the trace",
     "optimizer.build(model.trainable_variables) before the first call",
     "as written it raises TypeError '... is out of scope' on the first call with any optimizer "
     "that has slot variables (the recipe's Adam, SGD with momentum; measured below)"),
    ("000, 004", "optimizer.get_scaled_loss(loss)", "optimizer.scale_loss(loss)",
     "Keras 3's LossScaleOptimizer has no get_scaled_loss; scale_loss multiplies by the "
     "same dynamic scale"),
    ("000, 004", "grads = optimizer.get_unscaled_gradients(scaled_grads)",
     "grads = scaled_grads (the unscaling is left to apply_gradients)",
     "Keras 3 has no get_unscaled_gradients; its LossScaleOptimizer.apply divides the "
     "gradients by the scale itself (keras/src/optimizers/loss_scale_optimizer.py: "
     "_stateful_handle_finite_grads), so dividing first would unscale twice. The scale only "
     "changes inside apply, so within a window every micro-batch has the same power-of-two "
     "scale, and dividing the sum equals summing the quotients, bit for bit (barring fp32 "
     "overflow and subnormals)"),
    ("000", "mixed precision (solution 2) and accumulation (solution 1) as two loops, "
     "'stack them' in the summary", "solution 2's scaled loss inside solution 1's loop and "
     "inside the decorator, accumulation_steps 4 ('e.g. 4' in its text)",
     "Q6 needs the combination the recipe recommends"),
    ("004", "garbled text: 'def train_step(inputs, labels, first_batch=False): ... "
     "loss = tf.keras.losses=accumulation_steps):'",
     "def train_step(inputs, labels, step_counter, accumulation_steps=accumulation_steps), "
     "the body that follows the garble",
     "the loop calls train_step(batch[0], batch[1], step_counter) and the body reads "
     "step_counter % accumulation_steps"),
    ("004", "accum_gradients: a global Python list of tensors, reassigned inside @tf.function",
     "(first run as written: it fails) then a global list of tf.Variable, assign_add / assign",
     "the literal port raises TypeError '... is out of scope' on its first call (measured "
     "below); tf.Variable buffers are the smallest change that keeps the accumulation across "
     "calls the recipe intends (001's construct)"),
    ("004", "@tf.function train_step, traced once per value of the Python int step_counter",
     "traced as written in the run that measures the schedule (8 micro-batches an epoch); the "
     "other 004 runs call the same function under tf.config.run_functions_eagerly(True)",
     "each trace takes about a second here; eager execution changes no update (measured in "
     "004-schedule-first-update-after-one-micro-batch: the same micro-batches fire, the first "
     "update within rounding of the traced one)"),
    ("004", "model under mixed_float16 for Q1-Q4", "float32 policy for Q1-Q4 (the "
     "LossScaleOptimizer kept), mixed_float16 for Q6",
     "isolates the accumulation arithmetic from fp16 rounding; a power-of-two scale divides out"),
    ("001", "tf.keras.applications.ResNet50 subclass setting layer._recompute_grad = True",
     "the same loop over the MLP's layers (none is BatchNormalization)", "Q5 on the MLP"),
]


def ok_mark(flag):
    return "holds" if flag else "FAILS"


def finite_or_none(value):
    return value if value is not None and math.isfinite(value) else None


# ---- data, models, optimizers ---------------------------------------------------------------

FEATURES, LABELS = cwk.make_data()
INIT = cwk.make_init()
X = {dtype: tf.constant(FEATURES.astype(dtype)) for dtype in ("float32", "float64")}
Y = tf.constant(LABELS)


def micro_rows(rows, micro):
    return [np.arange(start, min(start + micro, rows)) for start in range(0, rows, micro)]


class MicroBatches:
    """The recipes' train_dataset: each iteration (epoch) yields (x, y) micro-batches in
    data order; `poison` {(epoch, index): factor} multiplies one micro-batch's inputs."""

    def __init__(self, rows, micro, dtype="float32", poison=None):
        self.rows = micro_rows(rows, micro)
        self.tensors = [(tf.gather(X[dtype], r), tf.gather(Y, r)) for r in self.rows]
        self.poison = poison or {}
        self.epoch = -1

    def __len__(self):
        return len(self.rows)

    def __iter__(self):
        self.epoch += 1
        for index, (x, y) in enumerate(self.tensors):
            factor = self.poison.get((self.epoch, index))
            yield (x * factor if factor else x), y


class RecipeModel:
    """The recipes' `model`: model(x, training=True) and model.trainable_variables."""

    def __init__(self, mlp):
        self.mlp = mlp

    def __call__(self, x, training=False):
        return self.mlp(x)

    @property
    def trainable_variables(self):
        return self.mlp.variables


class MixedMLP(cwk.KerasMLP):
    """KerasMLP under the mixed_float16 policy (float32 variables, float16 compute), its head
    Dense in float32 as recipes 001 and 004 ask ('the output layer in float32')."""

    def __init__(self):
        self.dtype = "float32"  # the variables' dtype (load() casts to it)
        self.layers = {}
        policy = "mixed_float16"

        def dense(name, units, inputs, dtype=policy):
            layer = keras.layers.Dense(units, dtype=dtype, name=name.replace(".", "_"))
            layer.build((None, inputs))
            self.layers[name] = layer

        def norm(name):
            layer = keras.layers.LayerNormalization(epsilon=cwk.LAYER_NORM_EPS, dtype=policy,
                                                    name=name.replace(".", "_"))
            layer.build((None, cwk.HIDDEN))
            self.layers[name] = layer

        dense("stem", cwk.HIDDEN, cwk.N_FEATURES)
        for i in range(cwk.DEPTH):
            norm(f"blocks.{i}.ln")
            dense(f"blocks.{i}.fc1", cwk.EXPANSION * cwk.HIDDEN, cwk.HIDDEN)
            dense(f"blocks.{i}.fc2", cwk.HIDDEN, cwk.EXPANSION * cwk.HIDDEN)
        norm("head.ln")
        dense("head", cwk.N_CLASSES, cwk.HIDDEN, dtype="float32")
        self.parameters = {}
        for name in cwk.parameter_shapes():
            module, kind = name.rsplit(".", 1)
            layer = self.layers[module]
            is_dense = isinstance(layer, keras.layers.Dense)
            variable = ((layer.kernel if kind == "weight" else layer.bias) if is_dense
                        else (layer.gamma if kind == "weight" else layer.beta))
            self.parameters[name] = (variable, is_dense and kind == "weight")
        self.variables = [variable for variable, _ in self.parameters.values()]
        self.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


MLP = {"float32": cwk.KerasMLP("float32"), "float64": cwk.KerasMLP("float64")}
PROBE = cwk.KerasMLP("float32")  # gradients at parameters a recipe had before an update
MIXED = None


def mixed_model():
    global MIXED
    if MIXED is None:
        MIXED = MixedMLP()
    MIXED.load(INIT)
    return MIXED


class Recorder:
    """tf.Variables an optimizer's apply() writes: how often it ran and the last gradients
    it was given (inside tf.function too, where a Python-side log would run at trace only)."""

    def __init__(self, variables):
        self.calls = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.last = [tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False)
                     for v in variables]


def recording(base):
    class Recording(base):
        def apply(self, grads, trainable_variables=None):
            grads = list(grads)
            for slot, gradient in zip(self.recorder.last, grads):
                slot.assign(tf.convert_to_tensor(gradient))
            self.recorder.calls.assign_add(1)
            return super().apply(grads, trainable_variables)
    Recording.__name__ = f"Recording{base.__name__}"
    return Recording


RecordingSGD = recording(keras.optimizers.SGD)
RecordingAdam = recording(keras.optimizers.Adam)


def make_optimizer(kind, dtype="float32", record=None, **options):
    """SGD: compare_with_keras.py's lr and momentum, no weight decay; Adam: Keras's defaults
    (the recipes' Adam()). record: variables to record apply() calls for (float32 only)."""
    previous = keras.config.floatx()
    keras.config.set_floatx(dtype)
    try:
        if kind == "sgd":
            cls = RecordingSGD if record is not None else keras.optimizers.SGD
            optimizer = cls(learning_rate=cwk.SGD["lr"], momentum=cwk.SGD["momentum"], **options)
            if dtype == "float64":  # see compare_with_keras.keras_optimizer
                optimizer.momentum = tf.constant(cwk.SGD["momentum"], tf.float64)
        else:
            cls = RecordingAdam if record is not None else keras.optimizers.Adam
            optimizer = cls(**options)
    finally:
        keras.config.set_floatx(previous)
    if record is not None:
        optimizer.recorder = Recorder(record)
    return optimizer


def snapshot(variables):
    return [v.numpy().copy() for v in variables]


class Observer:
    """observe(): called by each loop after each micro-batch; reads, changes nothing.
    Records the optimizer's apply() calls (with the gradient applied and the parameters
    before it), the iterations counter, the loss scale and whether the parameters moved."""

    def __init__(self, variables, optimizer, lso=None):
        self.variables = variables
        self.optimizer = optimizer
        inner = optimizer.inner_optimizer if lso is not None else optimizer
        self.recorder = getattr(inner, "recorder", None)
        self.lso = lso
        self.before = snapshot(variables)
        self.calls = 0
        self.micro = 0
        self.updates = []  # {"micro": 1-based micro-batch count when it fired, "before", "grad"}
        self.log = []      # per micro-batch: (moved, iterations, log2 of the scale or None)

    def __call__(self):
        self.micro += 1
        now = snapshot(self.variables)
        moved = any(not np.array_equal(a, b) for a, b in zip(now, self.before))
        if self.recorder is not None:
            calls = int(self.recorder.calls.numpy())
            if calls != self.calls:
                self.updates.append(dict(micro=self.micro, before=self.before,
                                         grad=[t.numpy().copy() for t in self.recorder.last]))
                self.calls = calls
        elif moved:
            self.updates.append(dict(micro=self.micro, before=self.before, grad=None))
        scale = None
        if self.lso is not None and self.lso.built:
            scale = math.log2(float(self.lso.dynamic_scale.numpy()))
        self.log.append((moved, int(self.optimizer.iterations.numpy()), scale))
        self.before = now


def probe_gradient(params, rows, per_sample_sum=False):
    """The large batch's gradient over `rows` at `params` (Keras layout), float32: the mean
    cross-entropy's gradient, or with per_sample_sum the sum of the per-sample gradients."""
    for variable, value in zip(PROBE.variables, params):
        variable.assign(value)
    _, gradients = PROBE.mean_loss_and_gradients(tf.gather(X["float32"], rows),
                                                 tf.gather(Y, rows))
    factor = len(rows) if per_sample_sum else 1.0
    return [g.numpy().astype(np.float64) * factor for g in gradients]


def combine(parts, weights):
    return [sum(w * p[i] for p, w in zip(parts, weights)) for i in range(len(parts[0]))]


def rel_list(candidate, reference):
    """max over tensors of max |a - b| / max |b| (compare_with_keras.relative)."""
    return max(cwk.relative(np.asarray(a, np.float64), np.asarray(b, np.float64))
               for a, b in zip(candidate, reference))


def norm_ratio(a, b):
    na = math.sqrt(sum(float(np.sum(np.square(np.asarray(t, np.float64)))) for t in a))
    nb = math.sqrt(sum(float(np.sum(np.square(np.asarray(t, np.float64)))) for t in b))
    return na / nb


def state_of(variables):
    """Parameters in PyTorch's names and layout (float64), as KerasMLP.state()."""
    out = {}
    for (name, (_, transposed)), variable in zip(MLP["float32"].parameters.items(), variables):
        value = variable.numpy().astype(np.float64)
        out[name] = value.T if transposed else value
    return out


def worst_or_inf(state, reference):
    if any(not np.all(np.isfinite(v)) for v in state.values()):
        return math.inf
    return cwk.worst(state, reference)


# ---- the large batch (the reference) ----------------------------------------------------------

REFERENCES = {}


def large_batch(dtype, rows, batch, steps, kind):
    model = MLP[dtype]
    model.load(INIT)
    optimizer = make_optimizer(kind, dtype)
    per_epoch = -(-rows // batch)
    losses = []
    for step in range(steps):
        start = (step % per_epoch) * batch
        index = np.arange(start, min(start + batch, rows))
        loss, gradients = model.mean_loss_and_gradients(tf.gather(X[dtype], index),
                                                        tf.gather(Y, index))
        optimizer.apply(gradients, model.variables)
        losses.append(float(loss))
    return model.state(), losses


def reference(rows, batch, steps, kind="sgd"):
    """(float32 state, float64 state, NOISE, bound, float32 losses): compare_with_keras's
    bound_of on the large batch's Keras runs."""
    key = (rows, batch, steps, kind)
    if key not in REFERENCES:
        k32, l32 = large_batch("float32", rows, batch, steps, kind)
        k64, _ = large_batch("float64", rows, batch, steps, kind)
        noise, bound = cwk.bound_of(k32, k64)
        REFERENCES[key] = (k32, k64, noise, bound, l32)
    return REFERENCES[key]


def against_large(state, rows, batch, steps, kind="sgd"):
    k32, _, noise, bound, _ = reference(rows, batch, steps, kind)
    diff = worst_or_inf(state, k32)
    return dict(max_rel_vs_large_batch=finite_or_none(diff), noise=noise, bound=bound,
                x_noise=finite_or_none(diff / noise), x_bound=finite_or_none(diff / bound),
                large_batch=f"{rows} rows, batch {batch}, {steps} steps, {kind}"), diff <= bound


# ---- the recipes, their logic in Keras 3 --------------------------------------------------------
# Each keeps its recipe's arithmetic and control flow; lines marked CHANGE are in CHANGES.

def recipe_000_loop(model, optimizer, loss_fn, train_dataset, num_epochs, accumulation_steps,
                    observe, loss_scale=False):
    """000, solution 1 (and with loss_scale, solution 2's scaled loss inside it)."""
    accumulated_grads = [tf.zeros_like(var) for var in model.trainable_variables]
    for epoch in range(num_epochs):
        total_loss = 0.0
        for step, (x, y) in enumerate(train_dataset):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = loss_fn(y, logits)
                if loss_scale:
                    scaled_loss = optimizer.scale_loss(loss)  # CHANGE: get_scaled_loss
            if loss_scale:
                scaled_grads = tape.gradient(scaled_loss, model.trainable_variables)
                grads = scaled_grads  # CHANGE: get_unscaled_gradients (apply unscales)
            else:
                grads = tape.gradient(loss, model.trainable_variables)
            accumulated_grads = [acc_grad + grad for acc_grad, grad in zip(accumulated_grads, grads)]
            if (step + 1) % accumulation_steps == 0:
                scaled_grads = [grad / accumulation_steps for grad in accumulated_grads]
                optimizer.apply_gradients(zip(scaled_grads, model.trainable_variables))
                accumulated_grads = [tf.zeros_like(var) for var in model.trainable_variables]
            total_loss += loss.numpy()
            observe()


def recipe_000_decorator(accumulation_steps, loss_scale=False):
    """000, solution 3: the decorator, as written (loss_scale: solution 2's scaled loss in it).
    Returns the decorated train_step (a tf.function taking model, optimizer, x, y, loss_fn)."""

    def gradient_accumulation(accumulation_steps):
        def decorator(train_step):
            @tf.function
            def wrapper(model, optimizer, x, y, loss_fn):
                if not hasattr(wrapper, 'accumulated_grads'):
                    wrapper.accumulated_grads = [tf.zeros_like(var) for var in model.trainable_variables]
                with tf.GradientTape() as tape:
                    logits = model(x, training=True)
                    loss = loss_fn(y, logits)
                    target = optimizer.scale_loss(loss) if loss_scale else loss  # CHANGE
                grads = tape.gradient(target, model.trainable_variables)
                wrapper.accumulated_grads = [acc + g for acc, g in zip(wrapper.accumulated_grads, grads)]
                if tf.equal(optimizer.iterations % accumulation_steps, 0):
                    scaled_grads = [g / accumulation_steps for g in wrapper.accumulated_grads]
                    optimizer.apply_gradients(zip(scaled_grads, model.trainable_variables))
                    wrapper.accumulated_grads = [tf.zeros_like(var) for var in model.trainable_variables]
                return loss
            return wrapper
        return decorator

    @gradient_accumulation(accumulation_steps=accumulation_steps)
    def train_step(model, optimizer, x, y, loss_fn):
        pass

    return train_step


def drive_000_decorator(train_step, model, optimizer, loss_fn, train_dataset, num_epochs, observe):
    for epoch in range(num_epochs):
        total_loss = 0.0
        for x, y in train_dataset:
            loss = train_step(model, optimizer, x, y, loss_fn)
            total_loss += loss.numpy()
            observe()


def recipe_001(model, optimizer, loss_fn, train_dataset, epochs, ACCUMULATION_STEPS, observe):
    """001, solution 1: tf.Variable buffers filled in a tf.function, a Python step_count."""
    accumulated_grads = [tf.Variable(tf.zeros_like(var), trainable=False)
                         for var in model.trainable_variables]

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        for i in range(len(accumulated_grads)):
            accumulated_grads[i].assign_add(grads[i])
        return loss

    for epoch in range(epochs):
        total_loss = 0.0
        step_count = 0
        for x_batch, y_batch in train_dataset:
            loss = train_step(x_batch, y_batch)
            total_loss += loss
            step_count += 1
            if step_count % ACCUMULATION_STEPS == 0:
                optimizer.apply_gradients(zip(accumulated_grads, model.trainable_variables))
                for grad_var in accumulated_grads:
                    grad_var.assign(tf.zeros_like(grad_var))
            observe()


accum_gradients = None  # recipe 004's global


def recipe_004(model, optimizer, dataset, epochs, accumulation_steps, observe, buffers):
    """004's loop. buffers="list": as written (a global list of tensors reassigned inside
    @tf.function); "variables": the same global holding tf.Variables (assign_add / assign).
    Returns the train_step tf.function (for its tracing count)."""
    global accum_gradients
    if buffers == "list":
        accum_gradients = [tf.zeros_like(var) for var in model.trainable_variables]

        @tf.function
        def train_step(inputs, labels, step_counter, accumulation_steps=accumulation_steps):
            with tf.GradientTape() as tape:
                predictions = model(inputs, training=True)
                loss = tf.keras.losses.sparse_categorical_crossentropy(
                    labels, predictions, from_logits=True)  # CHANGE: from_logits
                scaled_loss = optimizer.scale_loss(loss)  # CHANGE: get_scaled_loss
            scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
            gradients = scaled_gradients  # CHANGE: get_unscaled_gradients (apply unscales)
            global accum_gradients
            accum_gradients = [accum_grad + grad for accum_grad, grad in zip(accum_gradients, gradients)]
            if tf.equal(step_counter % accumulation_steps, 0):
                optimizer.apply_gradients(zip(accum_gradients, model.trainable_variables))
                accum_gradients = [tf.zeros_like(var) for var in model.trainable_variables]
            return tf.reduce_mean(loss)
    else:
        # CHANGE: the buffers are tf.Variables
        accum_gradients = [tf.Variable(tf.zeros_like(var), trainable=False)
                           for var in model.trainable_variables]

        @tf.function
        def train_step(inputs, labels, step_counter, accumulation_steps=accumulation_steps):
            with tf.GradientTape() as tape:
                predictions = model(inputs, training=True)
                loss = tf.keras.losses.sparse_categorical_crossentropy(
                    labels, predictions, from_logits=True)  # CHANGE: from_logits
                scaled_loss = optimizer.scale_loss(loss)  # CHANGE: get_scaled_loss
            scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
            gradients = scaled_gradients  # CHANGE: get_unscaled_gradients (apply unscales)
            for accum_grad, grad in zip(accum_gradients, gradients):  # CHANGE: assign_add
                accum_grad.assign_add(grad)
            if tf.equal(step_counter % accumulation_steps, 0):
                optimizer.apply_gradients(zip(accum_gradients, model.trainable_variables))
                for accum_grad in accum_gradients:  # CHANGE: assign
                    accum_grad.assign(tf.zeros_like(accum_grad))
            return tf.reduce_mean(loss)

    for epoch in range(epochs):
        step_counter = 0
        for batch in dataset:
            loss = train_step(batch[0], batch[1], step_counter)
            step_counter += 1
            observe()
    return train_step


# ---- the corrected loop ----------------------------------------------------------------------------

def corrected_loop(model, optimizer, dataset, epochs, accumulation_steps, observe=None,
                   loss_scale=False, max_steps=None):
    """Accumulation done right: each micro-batch's mean gradient weighted by its rows over
    the window's rows (the large batch's mean gradient, short micro-batches included); the
    window counted explicitly in Python, outside tf.function; an epoch's leftover micro-
    batches applied as that epoch's short last step (a DataLoader's short last batch), never
    carried; with loss_scale the loss scaled by the LossScaleOptimizer's current scale and
    the accumulated (scaled) gradients given to ONE apply() per step, which checks them for
    inf/nan once, skips the whole step and halves the scale once, or unscales and applies.
    Returns each step's loss (the window's mean)."""
    variables = model.variables
    optimizer.build(variables)  # the scale variable exists before scale_loss is traced
    dtype = variables[0].dtype
    accumulated = [tf.Variable(tf.zeros(v.shape, dtype), trainable=False) for v in variables]
    x_dtype = "float32" if isinstance(model, MixedMLP) else model.dtype

    @tf.function(input_signature=[tf.TensorSpec([None, cwk.N_FEATURES], x_dtype),
                                  tf.TensorSpec([None], tf.int64), tf.TensorSpec([], dtype)])
    def accumulate(x, y, weight):
        with tf.GradientTape() as tape:
            loss = model.loss(y, model(x))
            target = optimizer.scale_loss(loss) if loss_scale else loss
        for slot, gradient in zip(accumulated, tape.gradient(target, variables)):
            slot.assign_add(gradient * weight)
        return loss

    losses = []
    for _ in range(epochs):
        micro = list(dataset)
        for start in range(0, len(micro), accumulation_steps):
            window = micro[start:start + accumulation_steps]  # the epoch's last may be short
            rows = sum(int(x.shape[0]) for x, _ in window)
            step_loss = 0.0
            for index, (x, y) in enumerate(window):
                weight = int(x.shape[0]) / rows
                step_loss += float(accumulate(x, y, tf.constant(weight, dtype))) * weight
                if index == len(window) - 1:  # the window's end: one apply() per step
                    optimizer.apply([slot.read_value() for slot in accumulated], variables)
                    for slot in accumulated:
                        slot.assign(tf.zeros_like(slot))
                if observe:
                    observe()
            losses.append(step_loss)
            if max_steps and len(losses) == max_steps:
                return losses
    return losses


# ---- findings --------------------------------------------------------------------------------------

FINDINGS = []
FAILED = []


def finding(fid, recipe, question, measured, units, verdict, claim, holds):
    FINDINGS.append(dict(id=fid, recipe=recipe, question=question, measured=measured,
                         units=units, verdict=verdict, claim=claim, claim_holds=bool(holds)))
    if not holds:
        FAILED.append(fid)
    print(f"\n== {fid} ({recipe}) ==\n  {question}")
    for key, value in measured.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif isinstance(value, list) and len(value) > 24:
            value = f"{value[:24]} ... ({len(value)} entries)"
        print(f"  {key}: {value}")
    print(f"  units: {units}")
    print(f"  verdict: {verdict}")
    print(f"  claim checked: {claim} -> {ok_mark(holds)}")


def fmt(x):
    return "inf (non-finite parameters)" if x is None else f"{x:.3g}"


def loss_000():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def run_recipe_000_loop(shape, n, epochs, kind="sgd"):
    mlp = MLP["float32"]
    mlp.load(INIT)
    model = RecipeModel(mlp)
    optimizer = make_optimizer(kind, record=mlp.variables)
    observe = Observer(mlp.variables, optimizer)
    recipe_000_loop(model, optimizer, loss_000(), MicroBatches(**shape), epochs, n, observe)
    return state_of(mlp.variables), observe


def run_recipe_001(shape, n, epochs, kind="sgd"):
    mlp = MLP["float32"]
    mlp.load(INIT)
    model = RecipeModel(mlp)
    optimizer = make_optimizer(kind, record=mlp.variables)
    observe = Observer(mlp.variables, optimizer)
    recipe_001(model, optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
               MicroBatches(**shape), epochs, n, observe)
    return state_of(mlp.variables), observe


def run_recipe_004(shape, n, epochs, kind="sgd", buffers="variables", eager=False):
    """004 in float32 (its LossScaleOptimizer kept at 2^15). eager: the same train_step run
    eagerly (tf.config.run_functions_eagerly): the same values without a trace per value of
    the Python int counter (about a second each)."""
    mlp = MLP["float32"]
    mlp.load(INIT)
    model = RecipeModel(mlp)
    inner = make_optimizer(kind, record=mlp.variables)
    optimizer = keras.mixed_precision.LossScaleOptimizer(inner)
    observe = Observer(mlp.variables, optimizer, lso=optimizer)
    tf.config.run_functions_eagerly(eager)
    try:
        train_step = recipe_004(model, optimizer, MicroBatches(**shape), epochs, n, observe,
                                buffers)
    finally:
        tf.config.run_functions_eagerly(False)
    return state_of(mlp.variables), observe, train_step


def window_rows(shape, first, count):
    """Rows of micro-batches first .. first+count-1 of the micro-batch stream, which wraps
    around at the epoch's end (index taken modulo the micro-batches per epoch)."""
    rows = micro_rows(shape["rows"], shape["micro"])
    return [rows[(first + i) % len(rows)] for i in range(count)]


def section_000():
    print("\n#### recipe 000: the GradientTape loop")
    n = 2  # accumulation_steps = 2 in the recipe
    # Q1: equal micro-batches, no leftover
    shape = EVEN
    batch = n * shape["micro"]
    steps = 2 * shape["rows"] // batch
    state, obs = run_recipe_000_loop(shape, n, 2)
    measured, within = against_large(state, shape["rows"], batch, steps)
    first = obs.updates[0]
    large = probe_gradient(first["before"], np.arange(0, batch))
    measured.update(first_update_rel_vs_large_batch_gradient=rel_list(first["grad"], large),
                    updates=len(obs.updates), intended_updates=steps)
    finding("000-loop-mean-of-equal-micro-batches", "000 GradientTape loop",
            "Q1: does it apply the mean or the sum of the micro-batch gradients?",
            measured, "relative (max |diff| / max |large batch| over a tensor, worst tensor); "
            "x_noise = that / NOISE",
            f"the MEAN: (sum of {n} micro-batch mean gradients) / {n}; with equal micro-batches "
            f"it is the large batch's step: {fmt(measured['x_noise'])} x NOISE after {steps} steps "
            f"(bound {cwk.NOISE_FACTOR:g} x)",
            "parameters within the bound of the large batch's", within)

    # Q3: uneven, the short micro-batch (6 of 22) is the epoch's last, no leftover
    shape = UNEVEN
    batch = n * shape["micro"]
    per_epoch = -(-shape["rows"] // batch)
    state, obs = run_recipe_000_loop(shape, n, 1)
    measured, within = against_large(state, shape["rows"], batch, per_epoch)
    last = obs.updates[per_epoch - 1]
    parts_rows = window_rows(shape, n * (per_epoch - 1), n)
    parts = [probe_gradient(last["before"], r) for r in parts_rows]
    all_rows = np.concatenate(parts_rows)
    sizes = [len(r) for r in parts_rows]
    unweighted = combine(parts, [1.0 / n] * n)
    large = probe_gradient(last["before"], all_rows)
    measured.update(short_window_rows=sizes,
                    short_micro_batch_weight_applied=1.0 / n,
                    short_micro_batch_weight_large_batch=sizes[-1] / len(all_rows),
                    last_update_rel_vs_equal_weights=rel_list(last["grad"], unweighted),
                    last_update_rel_vs_large_batch_gradient=rel_list(last["grad"], large))
    holds = (not within and measured["last_update_rel_vs_equal_weights"] < 1e-4
             and measured["last_update_rel_vs_large_batch_gradient"] > 1e-2)
    finding("000-loop-short-micro-batch-unweighted", "000 GradientTape loop",
            "Q3: is the epoch's short last micro-batch weighted by its rows?", measured,
            "relative, as Q1; weights are fractions of the window's gradient",
            f"NO: the last window ({sizes[0]} + {sizes[1]} rows) averages the two micro-batch "
            f"means with weights 1/2 each, the 6-row one weighted {1 / n:.3g} instead of "
            f"{sizes[-1] / len(all_rows):.3g}; its gradient is "
            f"{measured['last_update_rel_vs_large_batch_gradient']:.3g} (relative) off the large "
            f"batch's, and after one epoch the parameters lie {fmt(measured['x_noise'])} x NOISE "
            "from it",
            "outside the bound; the last update equals the equal-weight mean (rel < 1e-4) and "
            "differs from the large batch's gradient (rel > 1e-2)", holds)

    # Q4: equal micro-batches of 20, 25 of them: one left over per epoch
    shape = LEFT
    batch = n * shape["micro"]
    per_epoch_large = -(-shape["rows"] // batch)
    m = len(micro_rows(shape["rows"], shape["micro"]))
    state, obs = run_recipe_000_loop(shape, n, 2)
    measured, within = against_large(state, shape["rows"], batch, 2 * per_epoch_large)
    per_epoch = [sum(1 for u in obs.updates if (u["micro"] - 1) // m == e) for e in range(2)]
    second = obs.updates[per_epoch[0]]  # the first update of epoch 2
    carried_rows = window_rows(shape, m - 1, 1) + window_rows(shape, 0, n)
    parts = [probe_gradient(second["before"], r) for r in carried_rows]
    carried = combine(parts, [1.0 / n] * len(parts))
    dropped = combine(parts[1:], [1.0 / n] * n)
    measured.update(updates_per_epoch=per_epoch, large_batch_steps_per_epoch=per_epoch_large,
                    epoch2_first_update_micro_batches=len(parts),
                    epoch2_first_update_rel_vs_carried=rel_list(second["grad"], carried),
                    epoch2_first_update_rel_vs_dropped=rel_list(second["grad"], dropped))
    holds = (not within and per_epoch == [m // n] * 2
             and measured["epoch2_first_update_rel_vs_carried"] < 1e-4
             and measured["epoch2_first_update_rel_vs_dropped"] > 1e-2)
    finding("000-loop-leftover-carried", "000 GradientTape loop",
            "Q4: what happens to an epoch's leftover micro-batch (25 micro-batches, windows of 2)?",
            measured, "updates: counts; rel: relative, as Q1",
            f"CARRIED: enumerate() restarts at each epoch but accumulated_grads is not reset, so "
            f"epoch 2's first update is (g_leftover + g_0 + g_1) / 2, three micro-batches over 2 "
            f"(rel {measured['epoch2_first_update_rel_vs_carried']:.2g} from that sum); "
            f"{per_epoch[0]} updates an epoch where the large batch takes {per_epoch_large}; "
            f"after 2 epochs {fmt(measured['x_noise'])} x NOISE from the large batch",
            "outside the bound; the update matches the carried sum (rel < 1e-4), not the "
            "dropped one (rel > 1e-2)", holds)


def section_000_decorator():
    print("\n#### recipe 000: the @tf.function decorator")
    n = 2
    shape = EVEN
    mlp = MLP["float32"]
    model = RecipeModel(mlp)
    # as written, with the recipe's Adam (its slots are created inside the first trace)
    outcomes = {}
    for kind in ("adam",):
        mlp.load(INIT)
        optimizer = make_optimizer(kind)
        observe = Observer(mlp.variables, optimizer)
        error = None
        try:
            drive_000_decorator(recipe_000_decorator(n), model, optimizer, loss_000(),
                                MicroBatches(**shape), 1, observe)
        except Exception as caught:  # the failure is the finding
            error = f"{type(caught).__name__}: {str(caught).splitlines()[0]}"
        outcomes[kind] = dict(calls_completed=observe.micro, error=error)
    holds = all(o["error"] is not None and o["calls_completed"] == 0 for o in outcomes.values())
    finding("000-decorator-fails-on-first-call", "000 @tf.function decorator",
            "does the decorator run as written?",
            outcomes["adam"],
            "counts",
            "NO, not with an optimizer that has slot variables (the recipe's Adam; SGD with "
            "momentum): they are created inside the first trace, tf.function traces a second "
            "time, and that trace finds hasattr() true and reads the tensors the first trace "
            "left in wrapper.accumulated_grads. It runs when the optimizer is built before the "
            "first call (optimizer.build(model.trainable_variables), the change made below; "
            "an optimizer without slots, plain SGD, needs none)",
            "raises on the first call with the recipe's Adam", holds)

    mlp.load(INIT)
    optimizer = make_optimizer("sgd", record=mlp.variables)
    optimizer.build(mlp.variables)  # CHANGE: built before the first traced call
    observe = Observer(mlp.variables, optimizer)
    train_step = recipe_000_decorator(n)
    epochs = 2
    drive_000_decorator(train_step, model, optimizer, loss_000(), MicroBatches(**shape), epochs,
                        observe)
    micro = epochs * len(micro_rows(shape["rows"], shape["micro"]))
    first = observe.updates[0]
    g0 = probe_gradient(first["before"], window_rows(shape, 0, 1)[0])
    g1 = probe_gradient(first["before"], window_rows(shape, 1, 1)[0])
    iterations = [entry[1] for entry in observe.log]
    measured = dict(micro_batches=micro, intended_updates=micro // n,
                    updates=len(observe.updates),
                    update_at_micro_batch=[u["micro"] for u in observe.updates],
                    iterations_after_each_call=iterations,
                    tracing_count=int(train_step.experimental_get_tracing_count()),
                    first_update_rel_vs_own_gradient_over_2=rel_list(first["grad"],
                                                                     combine([g0], [0.5])),
                    first_update_rel_vs_mean_of_2=rel_list(first["grad"],
                                                           combine([g0, g1], [0.5, 0.5])))
    holds = (len(observe.updates) == 1 and observe.updates[0]["micro"] == 1
             and measured["first_update_rel_vs_own_gradient_over_2"] < 1e-4)
    finding("000-decorator-fires-once", "000 @tf.function decorator",
            "Q2: does `optimizer.iterations % N == 0` fire every N micro-batches?", measured,
            "counts; rel: relative, as Q1",
            f"NO: iterations is 0 at the first call, so it applies at once; apply_gradients "
            f"makes it 1, and 1 % {n} never returns to 0 because only apply_gradients advances "
            f"it: {len(observe.updates)} update in {micro} micro-batches where {micro // n} were "
            "intended; every later call computes gradients and throws them away",
            "exactly 1 update, at micro-batch 1", holds)

    holds2 = (measured["tracing_count"] == 1
              and measured["first_update_rel_vs_own_gradient_over_2"] < 1e-4
              and measured["first_update_rel_vs_mean_of_2"] > 1e-2)
    finding("000-decorator-attribute-traced-once", "000 @tf.function decorator",
            "Q2: what does the Python attribute wrapper.accumulated_grads do inside tf.function?",
            dict(tracing_count=measured["tracing_count"],
                 first_update_rel_vs_own_gradient_over_2=measured[
                     "first_update_rel_vs_own_gradient_over_2"],
                 first_update_rel_vs_mean_of_2=measured["first_update_rel_vs_mean_of_2"]),
            "count; rel: relative, as Q1",
            "the attribute is set while tracing (once): the traced graph starts every call from "
            "zeros, so nothing accumulates across calls; the one update is g_0 / 2 (rel "
            f"{measured['first_update_rel_vs_own_gradient_over_2']:.2g}), not (g_0 + g_1) / 2 "
            f"(rel {measured['first_update_rel_vs_mean_of_2']:.2g}); the attribute then holds a "
            "tensor of a finished graph",
            "1 trace; the update is the first micro-batch's gradient / 2", holds2)

    # the epoch's short last micro-batch: a new shape retraces, and the retrace reads the
    # attribute left by the first trace
    mlp.load(INIT)
    optimizer = make_optimizer("sgd", record=mlp.variables)
    optimizer.build(mlp.variables)  # CHANGE: built before the first traced call
    observe = Observer(mlp.variables, optimizer)
    train_step = recipe_000_decorator(n)
    error = None
    try:
        drive_000_decorator(train_step, model, optimizer, loss_000(), MicroBatches(**FULL), 1,
                            observe)
    except Exception as caught:  # the failure is the finding
        error = f"{type(caught).__name__}: {str(caught).splitlines()[0]}"
    calls_done = observe.micro
    m = len(micro_rows(FULL["rows"], FULL["micro"]))
    holds3 = error is not None and calls_done == m - 1
    finding("000-decorator-short-micro-batch-crash", "000 @tf.function decorator",
            "Q3/Q4: the epoch's short last micro-batch (12 of 25 rows) with the decorator",
            dict(micro_batches_in_epoch=m, calls_completed=calls_done, error=error),
            "counts",
            f"it FAILS on the short micro-batch (call {calls_done + 1}): the new shape retraces, "
            "hasattr() is now true and the trace reads the tensor the first trace left in "
            "the attribute. Q3 and Q4 cannot be measured further: it never accumulates",
            "raises on the epoch's last (short) micro-batch, after all full ones", holds3)


def section_001():
    print("\n#### recipe 001: tf.Variable buffers")
    n = 4  # TARGET 128 / MICRO 32
    shape = EVEN
    batch = n * shape["micro"]
    steps = 2 * shape["rows"] // batch
    state, obs = run_recipe_001(shape, n, 2)
    measured, within = against_large(state, shape["rows"], batch, steps)
    first = obs.updates[0]
    large = probe_gradient(first["before"], np.arange(0, batch))
    measured.update(first_update_norm_over_large_batch_gradient=norm_ratio(first["grad"], large),
                    first_update_rel_vs_n_times_large=rel_list(first["grad"],
                                                               combine([large], [float(n)])))
    adam_state, _ = run_recipe_001(shape, n, 2, kind="adam")
    adam, adam_within = against_large(adam_state, shape["rows"], batch, steps, "adam")
    measured.update({f"adam_{k}": v for k, v in adam.items() if k != "large_batch"})
    holds = (not within and abs(measured["first_update_norm_over_large_batch_gradient"] - n) < 1e-3
             and measured["first_update_rel_vs_n_times_large"] < 1e-4)
    finding("001-sum-not-mean", "001 tf.Variable buffers",
            "Q1: does it apply the mean or the sum of the micro-batch gradients?", measured,
            "relative, as Q1; norm ratio: L2 norm of the applied gradient over the large "
            "batch's",
            f"the SUM: apply_gradients gets the buffers undivided, {n} x the large batch's "
            f"gradient (norm ratio {measured['first_update_norm_over_large_batch_gradient']:.6g}); "
            f"with SGD the parameters end {fmt(measured['x_noise'])} x NOISE (max rel "
            f"{measured['max_rel_vs_large_batch']:.3g}) from the large batch. The recipe's Adam "
            f"divides each gradient by its running RMS, so the factor {n} cancels except "
            f"against epsilon (1e-7): {fmt(measured['adam_x_noise'])} x NOISE (max rel "
            f"{measured['adam_max_rel_vs_large_batch']:.3g}), smaller but "
            f"{'inside' if adam_within else 'still outside'} the bound",
            "SGD outside the bound; the applied gradient is N x the large batch's (norm ratio "
            "within 1e-3 of N, rel < 1e-4)", holds)

    # Q3: uneven
    shape = UNEVEN
    batch = n * shape["micro"]
    per_epoch = -(-shape["rows"] // batch)
    _, obs = run_recipe_001(shape, n, 1)
    last = obs.updates[per_epoch - 1]
    parts_rows = window_rows(shape, n * (per_epoch - 1), n)
    parts = [probe_gradient(last["before"], r) for r in parts_rows]
    all_rows = np.concatenate(parts_rows)
    large = probe_gradient(last["before"], all_rows)
    measured = dict(short_window_rows=[len(r) for r in parts_rows],
                    last_update_rel_vs_sum_of_means=rel_list(last["grad"],
                                                             combine(parts, [1.0] * n)),
                    last_update_over_n_rel_vs_large_batch_gradient=rel_list(
                        combine([last["grad"]], [1.0 / n]), large),
                    short_micro_batch_weight_applied=1.0 / n,
                    short_micro_batch_weight_large_batch=len(parts_rows[-1]) / len(all_rows))
    holds = (measured["last_update_rel_vs_sum_of_means"] < 1e-4
             and measured["last_update_over_n_rel_vs_large_batch_gradient"] > 1e-2)
    finding("001-short-micro-batch-unweighted", "001 tf.Variable buffers",
            "Q3: is the epoch's short last micro-batch weighted by its rows?", measured,
            "relative, as Q1",
            "NO: the last window (22, 22, 22, 6 rows) is the plain sum of four micro-batch means; "
            "even with the factor N taken out (divided by 4) it is "
            f"{measured['last_update_over_n_rel_vs_large_batch_gradient']:.3g} (relative) off the "
            "large batch's gradient over those 72 rows",
            "the update equals the unweighted sum (rel < 1e-4), not N x the large batch's (rel > 1e-2)",
            holds)

    # Q4: leftover
    shape = LEFT
    batch = n * shape["micro"]
    per_epoch_large = -(-shape["rows"] // batch)
    m = len(micro_rows(shape["rows"], shape["micro"]))
    _, obs = run_recipe_001(shape, n, 2)
    per_epoch = [sum(1 for u in obs.updates if (u["micro"] - 1) // m == e) for e in range(2)]
    second = obs.updates[per_epoch[0]]
    carried_rows = window_rows(shape, m - 1, 1) + window_rows(shape, 0, n)
    parts = [probe_gradient(second["before"], r) for r in carried_rows]
    measured = dict(updates_per_epoch=per_epoch, large_batch_steps_per_epoch=per_epoch_large,
                    epoch2_first_update_micro_batches=len(parts),
                    epoch2_first_update_rel_vs_carried=rel_list(
                        second["grad"], combine(parts, [1.0] * len(parts))),
                    epoch2_first_update_rel_vs_dropped=rel_list(
                        second["grad"], combine(parts[1:], [1.0] * n)))
    holds = (per_epoch == [m // n] * 2 and measured["epoch2_first_update_rel_vs_carried"] < 1e-4
             and measured["epoch2_first_update_rel_vs_dropped"] > 1e-2)
    finding("001-leftover-carried", "001 tf.Variable buffers",
            "Q4: what happens to an epoch's leftover micro-batch (25 micro-batches, windows of 4)?",
            measured, "counts; relative, as Q1",
            f"CARRIED: step_count restarts each epoch, the buffers do not: epoch 2's first update "
            f"sums 5 micro-batch gradients (rel {measured['epoch2_first_update_rel_vs_carried']:.2g}"
            f"); {per_epoch[0]} updates an epoch where the large batch takes {per_epoch_large}",
            "matches the carried sum (rel < 1e-4), not the dropped one (rel > 1e-2)", holds)


def count_ops(graph):
    """Ops of a FuncGraph and of the functions in its library (tf.recompute_grad and
    custom gradients put their bodies there): (total, matmuls)."""
    definition = graph.as_graph_def()
    nodes = list(definition.node)
    for function in definition.library.function:
        nodes.extend(function.node_def)
    matmuls = sum(1 for node in nodes if node.op in ("MatMul", "BatchMatMulV2", "_MklMatMul",
                                                      "_FusedMatMul"))
    return len(nodes), matmuls


def gradient_graph(model, forward):
    variables = model.variables

    @tf.function(input_signature=[tf.TensorSpec([None, cwk.N_FEATURES], tf.float32),
                                  tf.TensorSpec([None], tf.int64)])
    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = model.loss(y, forward(x))
        return tape.gradient(loss, variables)

    concrete = gradients.get_concrete_function()
    x, y = tf.gather(X["float32"], np.arange(25)), tf.gather(Y, np.arange(25))
    return count_ops(concrete.graph), [g.numpy() for g in gradients(x, y)], concrete.graph


def section_001_checkpointing():
    print("\n#### recipe 001: 'selective gradient checkpointing' by attribute")
    plain = cwk.KerasMLP("float32")
    plain.load(INIT)
    (plain_ops, plain_mm), plain_g, plain_graph = gradient_graph(plain, plain)

    flagged = cwk.KerasMLP("float32")
    flagged.load(INIT)
    for layer in flagged.layers.values():  # the recipe's loop
        if isinstance(layer, keras.layers.BatchNormalization):
            continue
        layer.trainable = True
        layer._recompute_grad = True
    (flag_ops, flag_mm), flag_g, flag_graph = gradient_graph(flagged, flagged)
    same_types = (sorted(n.op for n in plain_graph.as_graph_def().node)
                  == sorted(n.op for n in flag_graph.as_graph_def().node))

    gelu = lambda t: keras.ops.gelu(t, approximate=True)

    def block(i):
        layers = flagged.layers

        @tf.recompute_grad
        def run(h):
            return h + layers[f"blocks.{i}.fc2"](gelu(layers[f"blocks.{i}.fc1"](
                layers[f"blocks.{i}.ln"](h))))
        return run

    blocks = [block(i) for i in range(cwk.DEPTH)]

    def recomputing(x):
        h = gelu(flagged.layers["stem"](x))
        for run in blocks:
            h = run(h)
        return flagged.layers["head"](flagged.layers["head.ln"](h))

    (rec_ops, rec_mm), rec_g, _ = gradient_graph(flagged, recomputing)

    with keras.RematScope(mode="full"):
        remat = cwk.KerasMLP("float32")
    remat.load(INIT)
    (remat_ops, remat_mm), remat_g, _ = gradient_graph(remat, remat)

    # who reads the attribute: a Python file of keras or tensorflow naming `._recompute_grad`
    # or the string '_recompute_grad' (getattr); grep -E, else Python
    site = pathlib.Path(keras.__file__).resolve().parent.parent
    pattern = r"\._recompute_grad\b|['\"]_recompute_grad['\"]"
    try:
        done = subprocess.run(["grep", "-rlE", "--include=*.py", pattern, str(site / "keras"),
                               str(site / "tensorflow")], capture_output=True, text=True)
        if done.returncode not in (0, 1):
            raise OSError(done.stderr)
        readers = len(done.stdout.split())
    except OSError:
        import re
        expression = re.compile(pattern)
        readers = sum(1 for package in ("keras", "tensorflow")
                      for path in (site / package).rglob("*.py")
                      if expression.search(path.read_text(errors="replace")))
    measured = dict(ops_plain=plain_ops, ops_with_attribute=flag_ops,
                    ops_tf_recompute_grad_per_block=rec_ops, ops_keras_remat_scope_full=remat_ops,
                    matmuls_plain=plain_mm, matmuls_with_attribute=flag_mm,
                    matmuls_tf_recompute_grad_per_block=rec_mm,
                    matmuls_keras_remat_scope_full=remat_mm,
                    same_op_types_with_and_without_attribute=same_types,
                    gradients_rel_attribute_vs_plain=rel_list(flag_g, plain_g),
                    gradients_rel_recompute_vs_plain=rel_list(rec_g, plain_g),
                    gradients_rel_remat_scope_vs_plain=rel_list(remat_g, plain_g),
                    files_in_keras_and_tensorflow_reading_the_attribute=readers)
    holds = (flag_ops == plain_ops and same_types and rec_mm > plain_mm and readers == 0
             and measured["gradients_rel_attribute_vs_plain"] == 0.0)
    finding("001-checkpointing-attribute-is-a-no-op", "001 selective checkpointing",
            "Q5: does setting layer._recompute_grad = True recompute anything?", measured,
            "ops: nodes in the traced gradient graph and its function library; matmuls: "
            "MatMul nodes among them; rel: relative, as Q1; files: Python files of the "
            "installed keras and tensorflow that read an attribute of that name",
            f"NOTHING: the gradient graph has {flag_ops} ops with the attribute and {plain_ops} "
            f"without (the same op types), the same {plain_mm} matmuls, and the same gradients "
            f"bit for bit; no file of Keras or TensorFlow reads the attribute. tf.recompute_grad "
            f"around each residual block gives {rec_ops} ops and {rec_mm} matmuls (the blocks' "
            f"forward again in the backward); keras.RematScope(mode='full') {remat_ops} ops and "
            f"{remat_mm} matmuls",
            "same op count and types, identical gradients, no reader; tf.recompute_grad adds "
            "matmuls", holds)


def section_004():
    print("\n#### recipe 004: accumulation with loss scaling")
    n = 4
    error = None
    calls = 0
    try:
        _, obs, _ = run_recipe_004(EVEN, n, 1, buffers="list")
        calls = obs.micro
    except Exception as caught:
        error = f"{type(caught).__name__}: {str(caught).splitlines()[0]}"
    finding("004-literal-port-does-not-run", "004 custom loop",
            "does the loop run as written (with only Keras 3's API renamed)?",
            dict(calls_completed=calls, error=error), "counts",
            "NO: on its first call the traced train_step reassigns the global Python list "
            "accum_gradients to tensors of its graph; the retrace that Keras's optimizer "
            "variables trigger on that first call reads them back from a finished graph. "
            "Below, the buffers are tf.Variables (the smallest change that keeps the recipe's "
            "accumulation), everything else as written",
            "raises before any micro-batch completes", error is not None and calls == 0)

    # traced as written (a Python int step_counter) on 8 micro-batches of 25 a epoch (each
    # counter value is a trace of its own, about a second each), two epochs
    shape = SHORT
    batch = n * shape["micro"]
    m = len(micro_rows(shape["rows"], shape["micro"]))
    steps = 2 * m // n
    state, obs, train_step = run_recipe_004(shape, n, 2)
    eager_state, eager_obs, _ = run_recipe_004(shape, n, 2, eager=True)
    fired = [u["micro"] for u in obs.updates]
    eager_first = rel_list(eager_obs.updates[0]["grad"], obs.updates[0]["grad"])
    intended = [n * (k + 1) for k in range(steps)]
    measured = dict(micro_batches_per_epoch=m, update_at_micro_batch=fired,
                    intended_update_at_micro_batch=intended,
                    micro_batches_in_first_update=fired[0],
                    tracing_count=int(train_step.experimental_get_tracing_count()),
                    distinct_step_counter_values=m,
                    eager_update_at_micro_batch=[u["micro"] for u in eager_obs.updates],
                    eager_vs_traced_first_update_rel=eager_first,
                    eager_vs_traced_parameters_rel=cwk.worst(eager_state, state))
    holds = (fired == [1, 1 + n, 1 + 2 * n, 1 + 3 * n] and measured["tracing_count"] >= m
             and measured["eager_update_at_micro_batch"] == fired and eager_first < 1e-5)
    finding("004-schedule-first-update-after-one-micro-batch", "004 custom loop",
            "Q2: does `step_counter % accumulation_steps == 0` fire every N micro-batches, and "
            "what does the Python counter do inside tf.function?", measured,
            "micro-batch counts (1-based, over the run); tracing_count: traces of train_step; "
            "rel: relative, as Q1",
            f"NO: it fires on the FIRST micro-batch of each epoch (step_counter is 0 when passed, "
            f"incremented after the call): updates after micro-batches {fired} where "
            f"{intended} were meant; the first update holds 1 micro-batch, later ones 4, one "
            f"window runs across the epoch's end. The Python int counter is part of the trace "
            f"key: {measured['tracing_count']} traces for {m} counter values (one per value; "
            f"the later runs of 004 below run the same function eagerly, "
            f"tf.config.run_functions_eagerly: the same updates at the same micro-batches, the "
            f"first update {eager_first:.2g} (relative) from the traced one; the parameters "
            f"{measured['eager_vs_traced_parameters_rel']:.2g} apart after this run, whose "
            f"100-fold steps amplify rounding)",
            "updates after micro-batches 1, 5, 9, 13; a trace per counter value", holds)

    first, second, third = obs.updates[0], obs.updates[1], obs.updates[2]
    g_first = probe_gradient(first["before"], window_rows(shape, 0, 1)[0], per_sample_sum=True)
    rows2 = np.concatenate(window_rows(shape, 1, n))
    g_second = probe_gradient(second["before"], rows2, per_sample_sum=True)
    ratio = norm_ratio(second["grad"], probe_gradient(second["before"], rows2))
    sgd, sgd_within = against_large(state, shape["rows"], batch, steps)
    measured = dict(first_update_rel_vs_sum_of_25_per_sample=rel_list(first["grad"], g_first),
                    second_update_rel_vs_sum_of_100_per_sample=rel_list(second["grad"], g_second),
                    second_update_norm_over_large_batch_mean=ratio)
    measured.update({f"sgd_{k}": v for k, v in sgd.items()})
    holds = (measured["first_update_rel_vs_sum_of_25_per_sample"] < 1e-4
             and measured["second_update_rel_vs_sum_of_100_per_sample"] < 1e-4
             and abs(ratio - batch) < 1e-2 * batch and not sgd_within)
    finding("004-sum-of-per-sample-gradients", "004 custom loop",
            "Q1: does it apply the mean or the sum of the micro-batch gradients?", measured,
            "relative, as Q1; norm ratio: L2 norm of the applied gradient over the large "
            "batch's mean gradient on the same rows",
            "the SUM of per-sample gradients (its text says 'apply the mean'): "
            "sparse_categorical_crossentropy without reduction returns one loss per sample, "
            "tape.gradient of that vector is the gradient of their sum, and the window is summed "
            f"undivided: a window of {batch} rows applies {ratio:.5g} x the large batch's mean "
            "gradient (the first update, 1 micro-batch, 25 x). With SGD the run ends "
            f"{fmt(measured['sgd_x_noise'])} x NOISE from the large batch",
            "update = sum of per-sample gradients (rel < 1e-4), norm ratio = window rows, SGD "
            "outside the bound", holds)

    rows3 = np.concatenate(window_rows(shape, m - (n - 1), n))  # micro 5, 6, 7 and the next 0
    g_third = probe_gradient(third["before"], rows3, per_sample_sum=True)
    g_third_dropped = probe_gradient(third["before"], window_rows(shape, 0, 1)[0],
                                     per_sample_sum=True)
    # Q3: uneven micro-batches (22, the epoch's last of 6), eagerly: the window that holds the
    # 6-row micro-batch is 21, 22, 23 and the next epoch's 0
    shape = UNEVEN
    mu = len(micro_rows(shape["rows"], shape["micro"]))
    _, obs, _ = run_recipe_004(shape, n, 2, eager=True)
    straddle = next(u for u in obs.updates if u["micro"] == mu + 1)
    parts_rows = window_rows(shape, mu - (n - 1), n)
    rows = np.concatenate(parts_rows)
    mean = probe_gradient(straddle["before"], rows)
    equal = combine([probe_gradient(straddle["before"], r) for r in parts_rows], [1.0 / n] * n)
    measured = dict(epoch_end_window_micro_batches=n - 1,
                    epoch2_first_update_rel_vs_carried=rel_list(third["grad"], g_third),
                    epoch2_first_update_rel_vs_dropped=rel_list(third["grad"], g_third_dropped),
                    uneven_window_micro_batch_rows=[len(r) for r in parts_rows],
                    uneven_update_over_rows_rel_vs_large_batch_mean=rel_list(
                        combine([straddle["grad"]], [1.0 / len(rows)]), mean),
                    equal_weight_mean_rel_vs_large_batch_mean=rel_list(equal, mean))
    holds = (measured["epoch2_first_update_rel_vs_carried"] < 1e-4
             and measured["epoch2_first_update_rel_vs_dropped"] > 1e-2
             and measured["uneven_update_over_rows_rel_vs_large_batch_mean"] < 1e-4
             and measured["equal_weight_mean_rel_vs_large_batch_mean"] > 1e-2)
    finding("004-leftover-carried-short-micro-batch-weighted", "004 custom loop",
            "Q4/Q3: the micro-batches left at an epoch's end, and the short micro-batch",
            measured, "relative, as Q1",
            f"Q4: CARRIED: the epoch's last {n - 1} micro-batches are applied with the next "
            "epoch's first (counter 0), one window across the epoch boundary (rel "
            f"{measured['epoch2_first_update_rel_vs_carried']:.2g} from that per-sample sum). "
            "Q3: WEIGHTED, as a side effect of the sum: every sample counts 1, so the 6-row "
            "micro-batch counts by its rows and the window's direction is the large batch's "
            f"(rel {measured['uneven_update_over_rows_rel_vs_large_batch_mean']:.2g} once divided "
            f"by the window's {len(rows)} rows; an equal-weight mean would be "
            f"{measured['equal_weight_mean_rel_vs_large_batch_mean']:.2g} off); the step length "
            "still grows with the rows",
            "epoch-2 first update = carried per-sample sum (rel < 1e-4, dropped > 1e-2); the "
            "uneven window / rows = large batch mean (rel < 1e-4)", holds)


# ---- Q6: loss scaling -----------------------------------------------------------------------------

def scale_events(observer, initial_scale):
    """[micro-batch (1-based), log2 scale after it] wherever the scale changed."""
    events, previous = [], math.log2(initial_scale)
    for index, (_, _, scale) in enumerate(observer.log):
        if scale is not None and scale != previous:
            events.append([index + 1, scale])
            previous = scale
    return events


def run_q6_loop(name, n, epochs, initial_scale, poison):
    shape = EVEN
    mlp = mixed_model()
    model = RecipeModel(mlp)
    dataset = MicroBatches(**shape, poison=poison)
    inner = make_optimizer("sgd")
    if name == "keras-builtin":
        inner = make_optimizer("sgd", gradient_accumulation_steps=n)
    lso = keras.mixed_precision.LossScaleOptimizer(inner, initial_scale=initial_scale)
    observe = Observer(mlp.variables, lso, lso=lso)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if name == "corrected":
        corrected_loop(mlp, lso, dataset, epochs, n, observe=observe, loss_scale=True)
    elif name == "000-loop":
        recipe_000_loop(model, lso, loss_fn, dataset, epochs, n, observe, loss_scale=True)
    elif name == "000-decorator":
        lso.build(mlp.variables)  # CHANGE: built before the first traced call
        drive_000_decorator(recipe_000_decorator(n, loss_scale=True), model, lso, loss_fn,
                            dataset, epochs, observe)
    elif name == "004":
        tf.config.run_functions_eagerly(True)
        try:
            recipe_004(model, lso, dataset, epochs, n, observe, "variables")
        finally:
            tf.config.run_functions_eagerly(False)
    elif name == "keras-builtin":
        lso.build(mlp.variables)

        @tf.function(input_signature=[tf.TensorSpec([None, cwk.N_FEATURES], tf.float32),
                                      tf.TensorSpec([None], tf.int64)])
        def scaled_gradients(x, y):
            with tf.GradientTape() as tape:
                loss = lso.scale_loss(mlp.loss(y, mlp(x)))
            return tape.gradient(loss, mlp.variables)

        for _ in range(epochs):
            for x, y in dataset:
                lso.apply(scaled_gradients(x, y), mlp.variables)
                observe()
    moved = [i + 1 for i, entry in enumerate(observe.log) if entry[0]]
    events = scale_events(observe, initial_scale)
    return dict(halved_at_micro_batch=[mb for mb, _ in events],
                log2_scale_after=[scale for _, scale in events],
                final_log2_scale=math.log2(float(lso.dynamic_scale.numpy())) if lso.built
                else math.log2(initial_scale),
                updates_applied=len(moved), parameters_moved_at_micro_batch=moved)


def section_q6(bigbatch, folder):
    print("\n#### Q6: loss scaling (mixed_float16, LossScaleOptimizer)")
    n, epochs = 4, 1
    shape = EVEN
    m = len(micro_rows(shape["rows"], shape["micro"]))
    windows = epochs * m // n
    start = 2.0 ** Q6_START_LOG2
    loops = ["corrected", "000-loop", "004", "000-decorator", "keras-builtin"]
    big, poisoned = {}, {}
    for name in loops:
        big[name] = run_q6_loop(name, n, epochs, start, None)
        poisoned[name] = run_q6_loop(name, n, epochs, 2.0 ** 15, {(0, POISON_AT): POISON_FACTOR})
    plain_004 = run_q6_loop("004", n, epochs, 2.0 ** 15, None)
    # bigbatch's own dynamic scaler (chapter 04's rule) on the same micro-batches, the 6th
    # poisoned in the data file, from 2^15
    poisoned_rows = FEATURES[:shape["rows"]].copy()
    poisoned_rows[POISON_AT * shape["micro"]:(POISON_AT + 1) * shape["micro"]] *= POISON_FACTOR
    np.save(folder / "X500.npy", poisoned_rows)
    np.save(folder / "y500.npy", LABELS[:shape["rows"]])
    log = folder / "fp16.jsonl"
    command = [str(bigbatch), "train", "--data", f"npy:{folder / 'X500.npy'},{folder / 'y500.npy'}",
               "--init", str(folder / "init.safetensors"), "--log", str(log), "--shuffle", "off",
               "--batch", str(n * shape["micro"]), "--micro-batch", str(shape["micro"]),
               "--steps", str(windows), "--depth", str(cwk.DEPTH), "--hidden",
               str(cwk.HIDDEN), "--expansion", str(cwk.EXPANSION), "--norm", "layer",
               "--activation", "gelu", "--dropout", "0", "--seed", "0", "--device", "cpu",
               "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "0",
               "--precision", "fp16", "--loss-scale", "dynamic", "--scale-init", str(2 ** 15)]
    done = subprocess.run(command, capture_output=True, text=True)
    bb = None
    if done.returncode == 0:
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        bb = dict(skipped_steps=[r["step"] for r in lines if r["skipped"]],
                  log2_scale_per_step=[math.log2(r["loss_scale"]) for r in lines])
    else:
        bb = dict(error=f"bigbatch exited {done.returncode}: {done.stderr.strip()[:200]}")

    scenario = (f"{m} micro-batches of {shape['micro']} (one epoch of {shape['rows']} rows), "
                f"windows of {n}: {windows} intended steps")
    units = ("micro-batch counts, 1-based over the run; a scale change is a skipped apply "
             "(halved); scales as log2")
    at_window_ends = lambda r, shift=0: all((mb - shift) % n == 0 for mb in r["halved_at_micro_batch"])
    cb, cp = big["corrected"], poisoned["corrected"]
    holds = (at_window_ends(cb) and at_window_ends(cp) and len(cp["halved_at_micro_batch"]) == 1
             and cp["updates_applied"] == windows - 1 and len(cb["halved_at_micro_batch"]) >= 1
             and bb.get("skipped_steps") == [(POISON_AT // n) + 1])
    finding("corrected-loss-scale-once-per-step", "corrected loop",
            "Q6/Q7: the corrected loop's loss scale (one apply() per window, on the summed "
            f"scaled gradients); {scenario}",
            {f"start_2^{Q6_START_LOG2}": cb, f"poisoned_micro_batch_{POISON_AT + 1}": cp,
             f"bigbatch_fp16_poisoned_micro_batch_{POISON_AT + 1}": bb},
            units,
            f"the rule (skip the whole step, halve once): from 2^{Q6_START_LOG2} windows overflow "
            f"until the scale is low enough, each halving once: halved after micro-batches "
            f"{cb['halved_at_micro_batch']}, the first update after micro-batch "
            f"{cb['parameters_moved_at_micro_batch'][:1]} at 2^{cb['final_log2_scale']:.0f}; the "
            f"poisoned micro-batch {POISON_AT + 1} (inputs x {POISON_FACTOR:g}: its fp16 forward "
            f"overflows) skips its whole window and halves once ({cp['halved_at_micro_batch']}), "
            f"the other {cp['updates_applied']} windows apply. bigbatch --precision fp16 "
            "--loss-scale dynamic (chapter 04) on the same micro-batches, the 6th poisoned in its "
            f"data file: skipped steps {bb.get('skipped_steps')}, log2 scale per step "
            f"{bb.get('log2_scale_per_step')}",
            "halvings only at window ends; one halving and windows - 1 updates with the "
            "poisoned micro-batch", holds)

    rb, rp = big["000-loop"], poisoned["000-loop"]
    holds = (at_window_ends(rb) and at_window_ends(rp)
             and rb["halved_at_micro_batch"] == cb["halved_at_micro_batch"]
             and rp["halved_at_micro_batch"] == cp["halved_at_micro_batch"])
    finding("000-loop-loss-scale-per-step", "000 loop + its solution 2 (stacked)",
            f"Q6: where is the loss scale updated, and what does one overflowing micro-batch do? "
            f"({scenario})",
            {f"start_2^{Q6_START_LOG2}": rb, f"poisoned_micro_batch_{POISON_AT + 1}": rp}, units,
            "ONCE PER OPTIMIZER STEP, as the rule: apply_gradients runs once per window, and an "
            "overflowing micro-batch makes the window's sum non-finite, so the whole window is "
            f"skipped and the scale halved once: halvings after micro-batches "
            f"{rb['halved_at_micro_batch']} (corrected: {cb['halved_at_micro_batch']}); poisoned: "
            f"{rp['halved_at_micro_batch']}, {rp['updates_applied']} updates. (Its faults are "
            "Q3 and Q4, not the scale.)",
            "the same halvings as the corrected loop", holds)

    rb, rp = big["004"], poisoned["004"]
    holds = (at_window_ends(rb, 1) and at_window_ends(rp, 1) and at_window_ends(plain_004, 1))
    finding("004-loss-scale-per-step", "004 custom loop",
            f"Q6: where is the loss scale updated, and what does one overflowing micro-batch do? "
            f"({scenario})",
            {f"start_2^{Q6_START_LOG2}": rb, f"poisoned_micro_batch_{POISON_AT + 1}": rp}, units,
            "ONCE PER UPDATE, as the rule: apply_gradients runs only in the firing branch (after "
            "micro-batches 1, 5, 9, ...), an overflow skips that whole window and halves once: "
            f"halvings after {rb['halved_at_micro_batch']} from 2^{Q6_START_LOG2}; poisoned: "
            f"{rp['halved_at_micro_batch']} (see 004-per-sample-loss-overflows for why there are "
            "more than one)",
            "halvings only where an update fires", holds)

    holds = (len(plain_004["halved_at_micro_batch"]) >= 1 and not cp["halved_at_micro_batch"][1:]
             and plain_004["final_log2_scale"] < 15)
    finding("004-per-sample-loss-overflows", "004 custom loop",
            "Q6: 004 at the default scale 2^15 with no poisoned micro-batch: how many windows "
            f"overflow? ({scenario})",
            dict(start_2_15_no_poison=plain_004,
                 corrected_halvings_at_2_15_with_one_poisoned_micro_batch=cp["halved_at_micro_batch"]),
            units,
            "004 scales the per-sample loss VECTOR (no mean): its scaled gradients are the sum over "
            "a micro-batch's 25 rows, 25 x the mean's, so fp16 overflows at scales the mean loss "
            f"survives: at LossScaleOptimizer's default 2^15 it halves after micro-batches "
            f"{plain_004['halved_at_micro_batch']} and applies {plain_004['updates_applied']} of "
            f"{windows} windows, ending at 2^{plain_004['final_log2_scale']:.0f}; the corrected loop "
            "skips only the poisoned window at 2^15",
            "004 halves at least once at 2^15 without poison; the corrected loop only for the "
            "poison", holds)

    rb, rp = big["000-decorator"], poisoned["000-decorator"]
    halved = rb["halved_at_micro_batch"]
    holds = (len(halved) >= 2 and halved == list(range(1, len(halved) + 1))
             and rb["updates_applied"] == 1 and rp["updates_applied"] == 1)
    finding("000-decorator-loss-scale-per-micro-batch", "000 decorator + its solution 2",
            f"Q6: where is the loss scale updated, and what does one overflowing micro-batch do? "
            f"({scenario})",
            {f"start_2^{Q6_START_LOG2}": rb, f"poisoned_micro_batch_{POISON_AT + 1}": rp}, units,
            "PER MICRO-BATCH while steps are skipped: a skipped step leaves optimizer.iterations "
            f"at 0, so iterations % {n} == 0 stays true and every call applies (its own gradient "
            f"/ {n}) and halves: halvings after micro-batches {halved} (the corrected loop: "
            f"{cb['halved_at_micro_batch']}); the first finite micro-batch is applied alone and "
            f"iterations = 1 then stops every update ({rb['updates_applied']} in {m}). With the "
            f"poisoned micro-batch: {rp['updates_applied']} update (micro-batch 1), no halving: "
            "no apply ever sees the poison",
            "halvings after micro-batches 1, 2, ..., then exactly 1 update", holds)

    rb, rp = big["keras-builtin"], poisoned["keras-builtin"]
    holds = (not at_window_ends(rb) and not at_window_ends(rp)
             and rp["halved_at_micro_batch"] == [POISON_AT + 1])
    finding("keras3-builtin-accumulation-loss-scale-per-micro-batch",
            "Keras 3 itself (not a recipe): LossScaleOptimizer(SGD(gradient_accumulation_steps=4))",
            f"Q6 contrast: the loss scale of Keras's own accumulation ({scenario})",
            {f"start_2^{Q6_START_LOG2}": rb, f"poisoned_micro_batch_{POISON_AT + 1}": rp}, units,
            "PER MICRO-BATCH: the LossScaleOptimizer checks and halves on every apply(), one per "
            f"micro-batch: halvings after {rb['halved_at_micro_batch']} from "
            f"2^{Q6_START_LOG2}; an overflowing micro-batch is dropped ALONE (halved after "
            f"{rp['halved_at_micro_batch']}) while the inner optimizer's count of 4 apply() calls "
            "goes on, so that step takes the next window's first micro-batch and every later "
            f"window shifts by one ({rp['updates_applied']} updates, after micro-batches "
            f"{rp['parameters_moved_at_micro_batch']})",
            "a halving between window ends; the poisoned micro-batch halves alone", holds)


# ---- Q7: the corrected loop against the large batch and bigbatch ----------------------------------

def section_corrected(bigbatch, folder):
    print("\n#### Q7: the corrected loop")
    n = 4
    for shape, label in ((UNEVEN, "uneven: micro-batches of 22, the epoch's last of 6"),
                         (LEFT, "leftover: 25 micro-batches of 20, windows of 4")):
        batch = n * shape["micro"]
        steps = 2 * -(-shape["rows"] // batch)
        mlp = MLP["float32"]
        mlp.load(INIT)
        corrected_loop(mlp, make_optimizer("sgd"), MicroBatches(**shape), 2, n)
        measured, within = against_large(mlp.state(), shape["rows"], batch, steps)
        finding(f"corrected-vs-large-batch-{'uneven' if shape is UNEVEN else 'leftover'}",
                "corrected loop", f"Q7: equal to the large batch? ({label}, 2 epochs)", measured,
                "relative, as Q1",
                f"{fmt(measured['x_noise'])} x NOISE from the large batch, bound "
                f"{cwk.NOISE_FACTOR:g} x", "within the bound", within)

    # compare_with_keras.py's setting: 512 rows, batch 100 (the epoch's last 12), 20 steps;
    # micro-batches of 25, the 12-row one the epoch's leftover window
    shape = FULL
    batch, steps = n * shape["micro"], cwk.STEPS
    runs = {}
    for dtype in ("float32", "float64"):
        mlp = MLP[dtype]
        mlp.load(INIT)
        losses = corrected_loop(mlp, make_optimizer("sgd", dtype),
                                MicroBatches(**shape, dtype=dtype), 10, n, max_steps=steps)
        runs[dtype] = (mlp.state(), losses)
    (c32, l32), (c64, _) = runs["float32"], runs["float64"]
    measured, within = against_large(c32, shape["rows"], batch, steps)
    finding("corrected-vs-large-batch-cwk-setting", "corrected loop",
            "Q7: equal to the large batch? (compare_with_keras.py's data: batch 100 of 4 x 25, "
            "the epoch's short batch of 12 as its leftover window; 20 steps)", measured,
            "relative, as Q1",
            f"{fmt(measured['x_noise'])} x NOISE from the large batch", "within the bound", within)

    flags = ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "0"]
    state, losses, command = cwk.train_bigbatch(bigbatch, folder, "corrected25", flags,
                                                shape["micro"])
    noise, bound = cwk.bound_of(c32, c64)
    ok = cwk.judge_case("corrected25", "bigbatch --micro-batch 25 against the corrected "
                        "recipe loop (Keras fp32; NOISE from the same loop in float64)",
                        command, state, losses, c32, l32, c64,
                        {k: v.astype(np.float64) for k, v in INIT.items()})
    diff = cwk.worst(state, c32)
    finding("corrected-vs-bigbatch-micro-batch", "corrected loop",
            "Q7: bigbatch train --batch 100 --micro-batch 25 against the corrected loop, by "
            "compare_with_keras.py's bound (judge_case)",
            dict(max_rel=diff, noise=noise, bound=bound, x_noise=diff / noise,
                 loss_max_abs_diff=max(abs(a - b) for a, b in zip(losses, l32)),
                 bigbatch_command=command.replace(str(folder), "$TMP")),
            "relative, as Q1; loss: absolute",
            f"{diff / noise:.3g} x NOISE (bound {cwk.NOISE_FACTOR:g} x)", "PASS in judge_case", ok)
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(c32[k]).tobytes()
                                     for k in sorted(c32))).hexdigest()
    return digest


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bigbatch", default=str(ROOT / "build/chapters/cli/bigbatch"))
    parser.add_argument("--out", help="write the findings as JSON to this file")
    parser.add_argument("--sections", default="000,000-decorator,001,001-checkpointing,004,q6,"
                        "corrected", help="comma-separated sections to run (default: all)")
    args = parser.parse_args()
    bigbatch = pathlib.Path(args.bigbatch)
    if not bigbatch.is_file():
        sys.exit(f"{bigbatch}: no such file; build it: cmake --build build --target bigbatch")

    print(f"tensorflow {tf.__version__}, keras {keras.__version__}, numpy {np.__version__}; "
          f"TensorFlow threads: {tf.config.threading.get_intra_op_parallelism_threads()} intra-op, "
          f"{tf.config.threading.get_inter_op_parallelism_threads()} inter-op; import "
          f"{IMPORTED - STARTED:.1f} s")
    print("Changes made to the recipes to run them (recipe: original -> replacement; why):")
    for recipe, original, replacement, why in CHANGES:
        print(f"  [{recipe}] {original}\n      -> {replacement}\n      why: {why}")

    timings = {}
    with tempfile.TemporaryDirectory(prefix="keras-recipes-") as name:
        folder = pathlib.Path(name)
        np.save(folder / "X.npy", FEATURES)
        np.save(folder / "y.npy", LABELS)
        import safetensors_f32
        safetensors_f32.write(folder / "init.safetensors", INIT)
        for label, section in (("000", section_000), ("000-decorator", section_000_decorator),
                               ("001", section_001), ("001-checkpointing", section_001_checkpointing),
                               ("004", section_004),
                               ("q6", lambda: section_q6(bigbatch, folder))):
            if label not in args.sections.split(","):
                continue
            began = time.monotonic()
            section()
            timings[label] = time.monotonic() - began
            print(f"  [{label}: {timings[label]:.1f} s]")
        digest = None
        if "corrected" in args.sections.split(","):
            began = time.monotonic()
            digest = section_corrected(bigbatch, folder)
            timings["corrected"] = time.monotonic() - began

    report = dict(tensorflow=tf.__version__, keras=keras.__version__, numpy=np.__version__,
                  threads=dict(intra_op=1, inter_op=1), noise_factor=cwk.NOISE_FACTOR,
                  changes=[dict(recipe=r, original=o, replacement=p, why=w)
                           for r, o, p, w in CHANGES],
                  corrected_fp32_parameters_sha256=digest, findings=FINDINGS)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
        print(f"\nwrote {args.out}")
    print("\nseconds per section: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    print(f"total time {time.monotonic() - STARTED:.1f} s")
    print(f"{len(FINDINGS)} findings, {len(FINDINGS) - len(FAILED)} claims hold")
    if FAILED:
        print(f"FAIL: {', '.join(FAILED)}")
        return 1
    print("PASS: every claimed fault measured as claimed, every corrected loop within its bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
