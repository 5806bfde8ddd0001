"""The vocabulary shared by the converter and the linter: which calls build which training objects.

Without the file's imports, matching is by the last component of a dotted name
(``torch.optim.AdamW`` and ``AdamW`` alike). With them (:class:`~accelify.transform.names.Names`),
the names whose namesakes matter are checked against their package: only torch's ``DataLoader``
is a loader ``prepare()`` shards, and ``from_pretrained`` builds a model only for a model class
(a tokenizer or a config built the same way is not one).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from enum import Enum
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from accelify.transform.names import Names


class Role(str, Enum):
    """What a name holds in a training script."""

    MODEL = "model"
    OPTIMIZER = "optimizer"
    DATALOADER = "dataloader"
    SCHEDULER = "scheduler"
    SCALER = "scaler"
    LOSS_SCALER = "loss scaler"  # runs the backward and the step itself (see loss_scaler.py)
    DEVICE = "device"
    ACCELERATOR = "accelerator"


OPTIMIZERS = frozenset(
    {
        "SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "NAdam",
        "RAdam", "ASGD", "SparseAdam", "Adafactor", "Lion", "AdamW8bit", "Adam8bit", "Muon",
    }
)  # fmt: skip
# LBFGS needs a closure; the converter refuses it, so it is a role of its own on purpose.
CLOSURE_OPTIMIZERS = frozenset({"LBFGS"})
SCHEDULERS = frozenset(
    {
        "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
        "ExponentialLR", "PolynomialLR", "CosineAnnealingLR", "ChainedScheduler", "SequentialLR",
        "ReduceLROnPlateau", "CyclicLR", "OneCycleLR", "CosineAnnealingWarmRestarts",
        "get_scheduler", "get_linear_schedule_with_warmup", "get_cosine_schedule_with_warmup",
        "get_constant_schedule", "get_constant_schedule_with_warmup",
        "get_polynomial_decay_schedule_with_warmup",
        "get_cosine_with_hard_restarts_schedule_with_warmup",
    }
)  # fmt: skip
DATALOADERS = frozenset({"DataLoader"})
SCALERS = frozenset({"GradScaler"})
ACCELERATORS = frozenset({"Accelerator"})
# Calls whose result is a module: torch.nn layers/containers and pretrained-model factories.
MODEL_FACTORIES = frozenset({"from_pretrained", "from_config", "Sequential", "ModuleList"})

ROLE_OF_CONSTRUCTOR: dict[str, Role] = {
    **dict.fromkeys(OPTIMIZERS, Role.OPTIMIZER),
    **dict.fromkeys(SCHEDULERS, Role.SCHEDULER),
    **dict.fromkeys(DATALOADERS, Role.DATALOADER),
    **dict.fromkeys(SCALERS, Role.SCALER),
    **dict.fromkeys(ACCELERATORS, Role.ACCELERATOR),
    **dict.fromkeys(MODEL_FACTORIES, Role.MODEL),
}

# A value or action the single-process script gets from the accelerator. The rewrites of
# hand-written DDP write ``__accelify_<what>__`` in the intermediate script; their resolve step
# turns it into ``accelerator.<what>`` where the accelerator is reachable, or
# ``PartialState().<what>``.
PREFIX = "__accelify_"
# Names that read which process this is, or how many there are: code that reads one may split
# or seed its data per process itself (nanoGPT's ``torch.manual_seed(1337 + ddp_rank)``).
RANK_NAMES = frozenset(
    {
        "process_index",
        "local_process_index",
        "num_processes",
        "split_between_processes",
        "split_dataset_by_node",
        "split_by_node",
        "DistributedSampler",
        "rank",
        "local_rank",
        "get_rank",
        "world_size",
        "get_world_size",
    }
)


def names_a_rank(name: str) -> bool:
    """``rank``, ``local_rank``, ``process_index``: a name that reads which process this is."""
    return name in RANK_NAMES or "rank" in name


# (function) -> packages it comes from: it changes the file or folder its arguments name, so
# every process doing it at once writes one file N times, or races (one removes what another
# just removed). Methods by their name alone: ``fig.savefig(...)``, ``df.to_csv(...)``.
DISK_WRITERS = {
    "save_image": ("torchvision",),
    "save": ("numpy",),
    "savez": ("numpy",),
    "savez_compressed": ("numpy",),
    "savetxt": ("numpy",),
    "imsave": ("matplotlib", "imageio", "skimage", "scipy"),
    "imwrite": ("imageio", "cv2"),
    "mimsave": ("imageio",),
    "mimwrite": ("imageio",),
    "show": ("matplotlib",),
    "remove": ("os",),
    "unlink": ("os",),
    "rmtree": ("shutil",),
    "copyfile": ("shutil",),
    "copy": ("shutil",),
    "copy2": ("shutil",),
    "copytree": ("shutil",),
    "move": ("shutil",),
    "makedirs": ("os",),
    "mkdir": ("os",),
}
DISK_WRITER_METHODS = frozenset({"savefig", "to_csv"})
# A logger's methods: what they are handed is only shown.
LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "log", "exception"})


def shows(call: cst.Call) -> bool:
    """``print(...)`` or a logger's method (``.info(...)``, ``.warning(...)``): it shows its
    arguments and does nothing else with them."""
    func = call.func
    if isinstance(func, cst.Name):
        return func.value == "print"
    return isinstance(func, cst.Attribute) and func.attr.value in LOG_METHODS


_DEVICE_TYPES = frozenset({"cuda", "cpu", "mps", "xpu"})
_DEVICE_CALLS = frozenset(
    {"torch.device", "device", "torch.accelerator.current_accelerator", "current_accelerator"}
)


def placeholder(what: str) -> cst.Name:
    return cst.Name(f"{PREFIX}{what}__")


def placeholder_of(node: cst.CSTNode) -> str | None:
    """``what`` for a placeholder name, else None."""
    if isinstance(node, cst.Name) and node.value.startswith(PREFIX) and node.value.endswith("__"):
        return node.value[len(PREFIX) : -2]
    return None


def returned_shards(mark: cst.Call) -> bool:
    """Whether ``mark``, the DDP rewrite's ``sharded(shuffle[, dataset])`` in a loader whose
    DistributedSampler went, gives the sampler back to a loader kept for evaluation: it was
    over the loader's own dataset (the mark then carries it), without shuffling."""
    shuffle = mark.args[0].value if mark.args else None
    return (
        placeholder_of(mark.func) == "sharded"
        and len(mark.args) == 2
        and isinstance(shuffle, cst.Name)
        and shuffle.value == "False"
    )


def is_device(
    expr: cst.BaseExpression, *, by_name: bool = True, names: Names | None = None
) -> bool:
    """``"cuda:0"``, ``torch.device(...)``, a choice between them, or (``by_name``) a name such as
    ``device``/``accelerator.device``: clearly a device. With the file's ``names``, torch under
    another name counts too (``t.device("cuda")`` after ``import torch as t``)."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return isinstance(value, str) and value.split(":")[0] in _DEVICE_TYPES
    if isinstance(expr, cst.IfExp):
        return is_device(expr.body, by_name=by_name, names=names) and is_device(
            expr.orelse, by_name=by_name, names=names
        )
    if isinstance(expr, cst.Call):
        return device_call(expr.func, names)
    if isinstance(expr, cst.Attribute) and expr.attr.value == "type":
        return isinstance(expr.value, cst.Call) and device_call(expr.value.func, names)
    name = dotted_name(expr) if by_name else None
    return name is not None and "device" in name.rsplit(".", 1)[-1].lower()


def device_call(func: cst.BaseExpression, names: Names | None = None) -> bool:
    """``torch.device`` (or ``t.device`` where ``names`` says ``t`` is torch)."""
    if dotted_name(func) in _DEVICE_CALLS:
        return True
    return names is not None and names.qualify(func) in _DEVICE_CALLS


def device_move(
    node: cst.CSTNode, device: Callable[[cst.BaseExpression], bool] = is_device
) -> cst.Call | None:
    """``node`` as ``x.cuda()`` or ``x.to(<device>, ...)`` (device first or ``device=``), else None.

    Other arguments (a dtype, ``non_blocking``) may follow; callers that need a pure move check.
    ``x.cuda(non_blocking=True)`` goes to the current GPU, as ``x.cuda()`` does.
    """
    move = method_call(node, "to", "cuda")
    if move is None:
        return None
    if move.func.attr.value == "cuda":  # type: ignore[union-attr]
        keywords = [arg.keyword.value if arg.keyword else None for arg in move.args]
        return move if all(k == "non_blocking" for k in keywords) else None
    target = moved_to(move)
    return move if target is not None and device(target) else None


def moved_to(move: cst.Call) -> cst.BaseExpression | None:
    """What ``x.to(...)`` is handed as its device, first or as ``device=`` (None for
    ``x.cuda()`` and for a ``.to`` with neither)."""
    first = move.args[0] if move.args else None
    if first is None or (first.keyword is not None and first.keyword.value != "device"):
        first = keyword_arg(move, "device")
    if move.func.attr.value == "cuda" or first is None:  # type: ignore[union-attr]
        return None
    return first.value


VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def pins_visible_devices(node: cst.CSTNode) -> bool:
    """Whether a statement sets ``CUDA_VISIBLE_DEVICES`` for its own process:
    ``os.environ["CUDA_VISIBLE_DEVICES"] = ...``, ``os.environ.setdefault(...)``, ``os.putenv``.

    Read where the script runs on many processes, each then sees only the GPUs it lists, while
    the launcher gives process *i* the GPU *i* of what it sees."""
    if isinstance(node, cst.Assign):
        return any(_environment_key(t.target) == VISIBLE_DEVICES for t in node.targets)
    if isinstance(node, cst.Expr) and isinstance(node.value, cst.Call) and node.value.args:
        call = node.value
        name = dotted_name(call.func) or ""
        key = call.args[0].value
        setter = name.endswith(("environ.setdefault", "putenv"))
        return (
            setter and isinstance(key, cst.SimpleString) and key.evaluated_value == VISIBLE_DEVICES
        )
    return False


def _environment_key(target: cst.BaseExpression) -> str | None:
    """``X`` for the target ``os.environ["X"]`` (or ``environ["X"]``)."""
    if not isinstance(target, cst.Subscript) or len(target.slice) != 1:
        return None
    if (dotted_name(target.value) or "").rsplit(".", 1)[-1] != "environ":
        return None
    index = target.slice[0].slice
    key = index.value if isinstance(index, cst.Index) else None
    value = key.evaluated_value if isinstance(key, cst.SimpleString) else None
    return value if isinstance(value, str) else None


def target_names(target: cst.BaseExpression) -> Iterator[str]:
    """The dotted names a (possibly unpacking) assignment target binds: ``a, (b, *self.c)``."""
    if isinstance(target, cst.Tuple | cst.List):
        for element in target.elements:
            yield from target_names(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from target_names(target.value)
    elif (name := dotted_name(target)) is not None:
        yield name


def unpacked(assign: cst.Assign) -> list[tuple[cst.BaseExpression, cst.BaseExpression]] | None:
    """``a, b = x, y``: each target with the value it gets; None for any other assignment
    (several targets, a value that is no tuple, a starred element, lengths that differ)."""
    target, value = assign.targets[0].target, assign.value
    if len(assign.targets) != 1 or not isinstance(target, cst.Tuple | cst.List):
        return None
    if not isinstance(value, cst.Tuple) or len(target.elements) != len(value.elements):
        return None
    if any(isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements)):
        return None
    return [(t.value, v.value) for t, v in zip(target.elements, value.elements, strict=True)]


def dotted_name(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None (calls, subscripts, ...)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def callee_name(call: cst.Call) -> str | None:
    """The last component of the called name: ``torch.optim.SGD(...)`` -> ``SGD``."""
    func = call.func
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


# ``AutoModelForCausalLM``, ``BertForSequenceClassification``, ``AutoencoderKL``, ...: not a
# tokenizer, a processor, a config or a noise scheduler, which load the same way.
_MODEL_CLASS = re.compile(r"Model|For[A-Z]|^Autoencoder")
# Where a loader that prepare() can shard comes from, and the modules of torch's containers.
_TORCH = ("torch",)


def constructor_role(value: cst.BaseExpression, names: Names | None = None) -> Role | None:
    """The role of the object a call builds: by the called name, checked against the file's
    imports when ``names`` is given."""
    if not isinstance(value, cst.Call):
        return None
    name = names.last_part(value.func) if names is not None else callee_name(value)
    role = ROLE_OF_CONSTRUCTOR.get(name) if name is not None else None
    if role is None or names is None:
        return role
    func = value.func
    if role is Role.DATALOADER:
        return role if names.refers_to(func, _TORCH, "DataLoader") else None
    if name in {"from_pretrained", "from_config"}:
        owner = func.value if isinstance(func, cst.Attribute) else None
        owner_name = dotted_name(owner) if owner is not None else None
        last = owner_name.rsplit(".", 1)[-1] if owner_name else ""
        return role if _MODEL_CLASS.search(last) else None
    if name in {"Sequential", "ModuleList"}:
        return role if names.refers_to(func, _TORCH, name) else None
    return role


def method_call(node: cst.CSTNode, *methods: str) -> cst.Call | None:
    """``node`` as a call of one of ``methods`` on some receiver (``x.to(...)``), else None."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in methods
    ):
        return node
    return None


def keyword_arg(call: cst.Call, name: str) -> cst.Arg | None:
    """The ``name=...`` argument of ``call``, if given."""
    return next((a for a in call.args if a.keyword and a.keyword.value == name), None)


def dataset_of(call: cst.Call) -> cst.BaseExpression | None:
    """A loader's or sampler's dataset: its first positional argument, or ``dataset=``."""
    if call.args and call.args[0].keyword is None:
        return call.args[0].value
    given = keyword_arg(call, "dataset")
    return given.value if given is not None else None


def loader_dataset_name(value: cst.BaseExpression | None) -> str | None:
    """``ds`` for ``DataLoader(ds, ...)`` or ``DataLoader(dataset=ds, ...)``."""
    if not isinstance(value, cst.Call) or callee_name(value) != "DataLoader":
        return None
    dataset = dataset_of(value)
    return dataset.value if isinstance(dataset, cst.Name) else None


def disk_writer(call: cst.Call, names: Names) -> str | None:
    """The name of the writer ``call`` runs (``save_image``, ``makedirs``, ``savefig``), when it
    is one of :data:`DISK_WRITERS` from its package or a :data:`DISK_WRITER_METHODS` method."""
    name = names.last_part(call.func)
    if name in DISK_WRITERS and names.from_package(call.func, *DISK_WRITERS[name]):
        return name
    # A method of any object, named or made right there (``pd.DataFrame(log).to_csv(path)``).
    method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
    return method if method in DISK_WRITER_METHODS else None


# In-memory files: a writer handed one writes nothing to the disk, and each process its own.
MEMORY_FILES = frozenset({"io.BytesIO", "io.StringIO"})


def memory_file(expr: cst.BaseExpression | None, names: Names) -> bool:
    """Whether ``expr`` makes an in-memory file (``io.BytesIO()``), which ``plt.savefig(buf)``
    fills for the same process to read back: nothing for the main process alone to do."""
    return isinstance(expr, cst.Call) and names.qualify(expr.func) in MEMORY_FILES


def random_draw(call: cst.Call, names: Names) -> bool:
    """Whether ``call`` draws from a random stream: ``random``'s, numpy's or torch's, under its
    imported name or a bare one a ``from pylab import *`` brought in."""
    dotted = names.qualify(call.func) or dotted_name(call.func) or ""
    return (
        dotted.startswith(_RANDOM_MODULES)
        or (dotted.startswith("torch.") and dotted.rsplit(".", 1)[-1] in _RANDOM_TORCH)
        or (
            dotted in _STAR_DRAWS
            and bool(names.stars & _STAR_RANDOM)
            and dotted not in names.defined
        )
    )


def random_stream(call: cst.Call, names: Names) -> str | None:
    """The stream a :func:`random_draw` draws from: ``"torch"``, ``"numpy"`` or ``"random"``
    (None for one a star import brought in: its module is not told)."""
    if not random_draw(call, names):
        return None
    dotted = names.qualify(call.func) or dotted_name(call.func) or ""
    if dotted.startswith("torch."):
        return "torch"
    if dotted.startswith(("numpy.", "np.")):
        return "numpy"
    return "random" if dotted.startswith("random.") else None


_RANDOM_MODULES = ("random.", "numpy.random.", "np.random.")
_RANDOM_TORCH = frozenset(
    {"rand", "randn", "randint", "randperm", "multinomial", "bernoulli", "normal", "rand_like",
     "randn_like", "randint_like"}
)  # fmt: skip
_STAR_RANDOM = frozenset({"pylab", "matplotlib.pylab", "numpy", "numpy.random", "random"})
_STAR_DRAWS = frozenset(
    {"random", "rand", "randn", "randint", "uniform", "normal", "choice", "shuffle",
     "permutation", "sample", "random_sample", "randrange", "gauss"}
)  # fmt: skip


# Random splits of a dataset, and the arguments that give one its own seed (torch's generator=,
# scikit-learn's random_state=, datasets' seed=). Without one a split draws from the process's
# own random stream.
SPLITS = frozenset({"random_split", "train_test_split"})
SPLIT_SEEDS = ("generator", "random_state", "seed")


def unseeded_split(call: cst.Call) -> bool:
    """``random_split(ds, [a, b])`` or ``train_test_split(x, y)`` with no seed of its own."""
    if callee_name(call) not in SPLITS or any(keyword_arg(call, k) for k in SPLIT_SEEDS):
        return False
    positional = [arg for arg in call.args if arg.keyword is None]
    return not (callee_name(call) == "random_split" and len(positional) >= 3)  # the generator


def asks_availability(
    expr: cst.BaseExpression,
    name: Callable[[cst.Name], cst.BaseExpression | None] = lambda _n: None,
) -> bool:
    """Whether ``expr`` only asks whether a device is there (``torch.cuda.is_available()``,
    combined with ``and``/``or``/``not``, or ``True if ... else False``), as an accelerator
    does when it picks one; ``name`` gives the one value a name is bound to, when known."""
    if isinstance(expr, cst.BooleanOperation):
        return asks_availability(expr.left, name) and asks_availability(expr.right, name)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        return asks_availability(expr.expression, name)
    if isinstance(expr, cst.Call):
        return (dotted_name(expr.func) or "").endswith("is_available")
    if isinstance(expr, cst.IfExp):
        flags = {dotted_name(expr.body), dotted_name(expr.orelse)} == {"True", "False"}
        return flags and asks_availability(expr.test, name)
    if isinstance(expr, cst.Name):
        value = name(expr)
        return value is not None and asks_availability(value, name)
    return False


def runs_as_script(branch: cst.CSTNode) -> bool:
    """``if __name__ == "__main__":``, which every launched process runs."""
    if not isinstance(branch, cst.If) or not isinstance(test := branch.test, cst.Comparison):
        return False
    right = test.comparisons[0].comparator if len(test.comparisons) == 1 else None
    return (
        isinstance(test.left, cst.Name)
        and test.left.value == "__name__"
        and isinstance(right, cst.SimpleString)
        and right.evaluated_value == "__main__"
    )
