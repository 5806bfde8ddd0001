"""Why accel-convert leaves a file or a training setup unchanged: one code per family of reasons.

A family has one cause and one manual fix, whatever names its messages quote: the report prints
the family's code before the message, and the docs site has a page for each (built from these
entries by ``docs/hooks/reference.py``). ``ACR1xx`` concern the whole file, ``ACR2xx`` one
training setup, ``ACR3xx`` a hand-written DistributedDataParallel script. A code, once given, is
never reused for another family: CI logs and bookmarks keep pointing at the same page.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """One family of reasons: what causes it, a script of that shape, and how to finish by hand."""

    code: str
    name: str  # kebab-case, as Ruff names its rules
    summary: str  # one line, for the index
    cause: str
    example: str  # a short script of the shape that is refused
    fix: str


ALREADY_DISTRIBUTED = Refusal(
    "ACR101",
    "already-distributed",
    "the script already runs on Accelerate, Lightning or a library Trainer",
    "The file imports an Accelerator (HF's or accelify's), Lightning, Horovod or torch_xla, or "
    "hands its model to `transformers.Trainer`: something else already distributes the "
    "training, and converting it again would prepare prepared objects.",
    "from accelerate import Accelerator\n\naccelerator = Accelerator()\n"
    "model, optimizer = accelerator.prepare(model, optimizer)",
    "Nothing to convert. Launch it with `accel-run`, and check it with `accel-lint`.",
)
OTHER_PARALLELISM = Refusal(
    "ACR102",
    "other-parallelism",
    "the script distributes itself in a way accel-convert does not rewrite",
    "Only plain data parallelism written with `DistributedDataParallel` or `DataParallel` is "
    "turned into an Accelerator. FSDP, device meshes, tensor or pipeline parallelism, RPC, "
    "worker processes started by hand or `deepspeed.initialize` train a different program from "
    "a prepared one: converting them would change what the script computes.",
    "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\nmodel = FSDP(Net())",
    "Port the distribution by hand: keep a single-process training loop, convert that, and "
    "let the launcher shard it (`accel-run --use-fsdp` or `--use-deepspeed`, or the same "
    "options of `accelerate launch`).",
)
TRAINER_AND_LOOP = Refusal(
    "ACR103",
    "trainer-and-loop",
    "the script trains through a library Trainer and also by hand",
    "A `transformers.Trainer` (or trl's) distributes its own training, but the file also has a "
    "training step of its own: which of the two runs, and with what, is the script's decision.",
    "trainer = Trainer(model=model, args=args)\ntrainer.train()\n"
    "for batch in loader:\n    loss = model(**batch).loss\n    loss.backward()",
    "Convert the hand-written loop by hand (or move it to its own script and convert that); the "
    "Trainer's part runs on Accelerate as it is.",
)
UNPRINTABLE = Refusal(
    "ACR104",
    "unprintable",
    "libcst cannot print this file back exactly",
    "Every edit is made on libcst's tree, which prints a few odd inputs (some whitespace and "
    "line continuations) back differently from how they were written. Any conversion would "
    "silently change those lines, so the file stays as it is; it is still right on one process.",
    "total = (first +\n    second)  # with a form feed (\\f) in the indentation",
    "Tidy the reported line (a formatter such as `ruff format` does) and convert again, or "
    "convert the script by hand.",
)
NOTEBOOK_SPLIT = Refusal(
    "ACR105",
    "notebook-split",
    "the converted notebook does not split back into its cells",
    "A notebook's code cells are converted as one script and cut back at markers between "
    "cells. When the conversion moves code across a cell boundary (the accelerator created in "
    "a `%%magic` cell, a cell that no longer parses on its own), the cells cannot be rebuilt "
    "and the notebook is left unchanged.",
    "# cell 1\nmodel = Net()\n# cell 2\n%%time\noptimizer = SGD(model.parameters(), lr=0.1)",
    "Keep the training objects and their training step in plain code cells (move `%%magic` "
    "cells out of the way), or convert an exported script (`jupyter nbconvert --to script`).",
)
TRAINING_ELSEWHERE = Refusal(
    "ACR106",
    "training-elsewhere",
    "the training step runs in code this file does not show",
    "The file builds its model and optimizer and hands them to a function of another module "
    "(`train_model(model, optimizer, ...)`, a loss scaler that runs the backward, a subclass "
    "of another package's trainer): the step to convert is not in this file.",
    "from engine import train_one_epoch\n\n"
    "optimizer = SGD(model.parameters(), lr=0.1)\ntrain_one_epoch(model, optimizer, loader)",
    "Give accel-convert this file with the module that trains (both paths, or their folder): "
    "a script that imports its training step from a module beside it is converted together "
    "with it (see ACR108 for when that is refused). Otherwise convert the file that holds the "
    "step, or bring the step into this file; nothing here is wrong on its own.",
)
NO_TRAINING = Refusal(
    "ACR107",
    "no-training",
    "there is no training step to convert",
    "The backward only computes gradients (saliency maps, gradient checks) and nothing steps "
    "an optimizer after it, or no training is left once the hand-written distribution is "
    "removed: there is nothing for an accelerator to prepare.",
    "loss = model(x).sum()\nloss.backward()\nsaliency = x.grad.abs()",
    "Nothing to convert when the script does not train. When it does, make its training step "
    "visible (an optimizer built over the model's parameters, stepped after the backward).",
)
PROGRAM_SPLIT = Refusal(
    "ACR108",
    "program-split",
    "the files of one program cannot be converted together",
    "Given a folder or several files, a script that imports its training step from a module "
    "beside it (`from engine import train_one_epoch`) is converted together with that module. "
    "That is refused when the module trains for two scripts or imports training from a third "
    "file, when it is imported under another name, or when the conversion would leave a file "
    "reading a name it does not define (an `accelerator` only the script holds): one file "
    "converted without the other would train half-converted.",
    "# main.py and finetune.py both train with engine.py\n"
    "from engine import train_one_epoch\n\ntrain_one_epoch(model, criterion, loader, optimizer)",
    "Give the module's training function an `accelerator` parameter and convert each script "
    "by hand, or keep one script per training module and convert the folder again.",
)
CLOSURE = Refusal(
    "ACR201",
    "closure",
    "the optimizer steps with a closure",
    "`LBFGS` and any `optimizer.step(closure)` re-evaluate the model inside the step, as often "
    "as the optimizer asks. accel-convert does not rewrite that step (the backward inside the "
    "closure, what gradient accumulation would mean across its calls), so the setup is left as "
    "it is. The prepared optimizer itself passes a closure on (not under fp16 mixed precision).",
    "optimizer = torch.optim.LBFGS(model.parameters())\n\n"
    "def closure():\n    optimizer.zero_grad()\n    loss = criterion(model(x), y)\n"
    "    loss.backward()\n    return loss\n\noptimizer.step(closure)",
    "Convert by hand: create the accelerator, prepare the model, and in the closure call "
    "`accelerator.backward(loss)`; or train with an optimizer that steps without a closure.",
)
BUILT_IN_LOOP = Refusal(
    "ACR202",
    "built-in-loop",
    "a training object, the device or the accelerator would be made inside a loop",
    "`prepare()` wraps each object once, and one accelerator serves the whole run. An "
    "optimizer, model or device made again on every iteration (a sweep over learning rates, "
    "a fold loop) would need a new accelerator each time.",
    "for lr in (0.1, 0.01):\n    optimizer = SGD(model.parameters(), lr=lr)\n"
    "    for x, y in loader:\n        ...",
    "Move the loop body into a function that builds and trains one configuration, and convert "
    "that; or create one accelerator before the loop and `prepare()` each new object by hand.",
)
SECOND_SETUP = Refusal(
    "ACR203",
    "second-setup",
    "a second training setup in the same file",
    "accel-convert converts one training setup per file: the scope that builds a model's "
    "optimizer and runs its training step. A second one (a pre-training and a fine-tuning "
    "function, a GAN trained in another function) is left unchanged, since two accelerators "
    "in one run would each claim the processes. Where both setups train through the same "
    "functions (one `train()` for two experiments), neither is converted: the shared code's "
    "edits would change the one left alone too.",
    "def pretrain():\n    optimizer = Adam(model.parameters())\n    ...\n\n"
    "def finetune():\n    optimizer = SGD(head.parameters(), lr=0.01)\n    ...",
    "Convert the second setup by hand with the same accelerator (pass it in and `prepare()` "
    "its objects), or split the file into one script per setup.",
)
STEP_OUTSIDE_SETUP = Refusal(
    "ACR204",
    "step-outside-setup",
    "a training step is not reached from the setup that builds its objects",
    "The objects prepare() would wrap are built in one function, but a `.backward()` that "
    "trains them is not reached from it by calls accel-convert follows (a function the setup "
    "never calls, a callback registered for later, a step an engine or a runner object runs). "
    "That step would stay unconverted beside converted objects.",
    "def setup():\n    model, optimizer = Net(), SGD(...)\n    return model, optimizer\n\n"
    "def step(model, optimizer, x, y):\n    criterion(model(x), y).backward()",
    "Call the training from the function that builds its objects (or build them where the "
    "training runs), then convert again; or convert by hand.",
)
OBJECTS_NOT_FOLLOWED = Refusal(
    "ACR205",
    "objects-not-followed",
    "the analysis cannot tie the model, its optimizer and the training step together",
    "To prepare a setup the converter must see which model each optimizer trains, where both "
    "are built, and that they exist on every path before training starts. A model that comes "
    "in as a parameter, an optimizer built from an expression it does not read, objects built "
    "in different functions or only on some paths, or parameters updated by hand cannot be "
    "followed.",
    "def train(model):  # the caller owns the model\n"
    "    optimizer = SGD(model.parameters(), lr=0.1)\n    ...",
    "Build the model and its optimizer in the function that runs the training (or calls it), "
    "with `torch.optim` over `model.parameters()`; or convert by hand.",
)
UNTRACKED_USE = Refusal(
    "ACR206",
    "untracked-use",
    "a use of a prepared object the analysis cannot account for",
    "`prepare()` returns new objects (a DistributedDataParallel wrapper, a sharded loader). "
    "An alias taken before it (`net = model`, `models = [g, d]`), an object handed to code "
    "this file does not show (`torch.compile`, a privacy engine, another module's helper), or "
    "an instance built around the bare objects keeps what they were, and would train without "
    "gradient synchronisation. A module loaded with a model's weights before `prepare()` "
    "(`target.load_state_dict(model.state_dict())`) keeps each process's own initial weights, "
    "while `prepare()` gives the model the main process's.",
    "model = Net()\nnets = [model]\noptimizer = SGD(model.parameters(), lr=0.1)\n"
    "for x, y in loader:\n    loss = criterion(nets[0](x), y)",
    "Use the prepared name directly (take aliases after `prepare()`), or call the other code "
    "on the prepared objects by hand.",
)
BUILD_ORDER = Refusal(
    "ACR207",
    "build-order",
    "the objects are built in an order prepare() cannot fit",
    "`prepare()` goes right after the last training object is built and before anything "
    "uses them. An object rebuilt after training started, a model rebound to what a training "
    "function returns, an object handed to a `Trainer` or a progress bar or iterator the "
    "training walks (`pbar = tqdm(loader)`) made before `prepare()` can wrap it, or an "
    "`Accelerator(...)` argument set only after the objects need the accelerator leaves no "
    "such point.",
    "trainer = Trainer(model, optimizer)  # keeps the bare objects\n"
    "loader = DataLoader(dataset, batch_size=32)\ntrainer.fit(loader)",
    "Build every training object first and hand them on afterwards, then convert again; or "
    "call `accelerator.prepare()` by hand where the objects are ready.",
)
BARE_MODULE = Refusal(
    "ACR208",
    "bare-module",
    "the training step would run the model around the prepared wrapper",
    "On several processes the prepared model is a wrapper that synchronises gradients when "
    "its forward runs. A step that calls a method the model's class adds "
    "(`model.compute_loss(x)`), or that runs an inner module the wrapper was built around, "
    "bypasses it: the replicas would drift apart. A module that trains itself, or a submodule "
    "of its own in its methods (a GAIL discriminator's `self.trunk`), cannot hold the wrapper "
    "in its own place.",
    "for x, y in loader:\n    loss = model.compute_loss(x, y)\n    loss.backward()",
    "Compute the loss from `model(x)` (move the method's work into `forward`), or convert by "
    "hand and keep such calls out of the training step.",
)
HAND_PICKED_DEVICE = Refusal(
    "ACR209",
    "hand-picked-device",
    "the script picks a GPU or a device itself",
    "The accelerator gives each process its own device. `torch.cuda.set_device(...)`, "
    "`.cuda(index)`, a model moved off its device while training goes on, a batch read with "
    "`.numpy()` as if it were on the CPU, a device chosen again among other statements, or "
    "moves that stay reading a flag (`t.to(args.device)`) the model's own move read, while "
    "prepare() now places the model, would put tensors on devices the accelerator did not "
    "pick.",
    "torch.cuda.set_device(args.gpu)\nmodel = Net().cuda(args.gpu)",
    "Drop the hand-picked device: use `accelerator.device`, `.cpu()` before `.numpy()`, and "
    "`accelerator.unwrap_model(model).state_dict()` instead of moving the model to save it.",
)
ACCELERATOR_UNREACHABLE = Refusal(
    "ACR210",
    "accelerator-unreachable",
    "code that needs the accelerator cannot reach it",
    "A converted line uses the accelerator, but it runs before the accelerator is created, "
    "may run without it (after a `try` or an `if` whose block creates it, such as a save in "
    "`except KeyboardInterrupt:`), or runs in a method of another class, a nested function or "
    "a function also called from elsewhere, which cannot be handed it. A device chosen at "
    "module level and read by other functions becomes `PartialState().device`, which the "
    "accelerator shares; one chosen there more than once, or before the accelerator's `cpu=` "
    "choice, is the common case left.",
    'device = "cpu"  # module level\nif torch.cuda.is_available():\n    device = "cuda"\n\n'
    "def train():\n    model = Net().to(device)\n    ...",
    "Move the code (or the device choice) into the function that creates the accelerator, or "
    "pass the accelerator to it by hand.",
)
NAME_TAKEN = Refusal(
    "ACR211",
    "name-taken",
    "the name the conversion needs is already taken",
    "The conversion imports `Accelerator` and creates `accelerator` (or `self.accelerator`). "
    "When the file already binds one of those names to something else, the converted code "
    "would shadow it.",
    "from mylib import Accelerator  # something else",
    "Rename the script's own `Accelerator` or `accelerator`, then convert again.",
)
LOCKSTEP = Refusal(
    "ACR212",
    "lockstep",
    "a training step not every process runs",
    "Each `accelerator.backward()` ends in an all-reduce that every process must join. A "
    "loop, branch or early exit around the step decided by a value processes compute apart "
    "(this process's loss or batch, a clock, its rank, an unseeded random draw) can send one "
    "process out of the loop while the others wait: gloo fails, NCCL hangs.",
    "for x, y in loader:\n    loss = criterion(model(x), y)\n"
    "    if loss.item() < 0.01:\n        break\n    loss.backward()",
    "Decide on a value every process shares: reduce it first "
    "(`accelerator.reduce(loss, 'mean')`), or seed the random draw, then convert again.",
)
ACCUMULATION = Refusal(
    "ACR213",
    "accumulation",
    "the optimizer steps do not fit accumulate()'s window",
    "`accelerator.accumulate(model)` holds every optimizer step to the last batch of a window "
    "and syncs gradients only there. Steps that alternate with later backwards, run several "
    "times per batch, a `zero_grad()` before the backward, two loops with different step "
    "counts, or the script's own gradient-sync schedule cannot be kept inside it.",
    "for i, (x, y) in enumerate(loader):\n    optimizer.zero_grad()\n"
    "    (criterion(model(x), y) / 4).backward()\n    if (i + 1) % 4 == 0:\n"
    "        optimizer.step()",
    "Convert without `--gradient-accumulation-steps` (the manual accumulation stays right on "
    "several processes), or reorder the loop as the message says.",
)
STEP_ORDER = Refusal(
    "ACR214",
    "step-order",
    "optimizers or schedulers step in an order one prepared object cannot keep",
    "Several optimizers whose backward or step runs outside the loop that trains them, or "
    "schedulers stepped both per batch and per epoch: a prepared scheduler steps either once "
    "per process or once per call, and the order of the steps cannot be checked.",
    "for x, y in loader:\n    ...\n    batch_scheduler.step()\nepoch_scheduler.step()",
    "Step every scheduler at the same place (per batch or per epoch), and keep every "
    "optimizer's step in the training loop, then convert again; or convert by hand.",
)
MIXED_PRECISION = Refusal(
    "ACR215",
    "mixed-precision",
    "--mixed-precision cannot take over the script's GradScaler",
    "With `--mixed-precision` the accelerator's one loss scaler replaces the script's "
    "`GradScaler`. A scaler the script also passes around or checkpoints, or several "
    "optimizers stepped with no backward between them under fp16, cannot be taken over.",
    "scaler = GradScaler()\n...\ntorch.save({'scaler': scaler.state_dict()}, path)",
    "Convert without `--mixed-precision`: the script keeps its own autocast and GradScaler, "
    "which run as written on every process.",
)
UNSYNCED_GRADIENTS = Refusal(
    "ACR216",
    "unsynced-gradients",
    "a backward or gradient sync the accelerator cannot run as the script wrote it",
    "DistributedDataParallel averages gradients in the first backward after each forward, and "
    "`accelerator.backward(loss)` scales one loss. A second backward through the same forward "
    "(`retain_graph=True`), `torch.autograd.backward(...)` over several tensors, or a sync "
    "toggle (`no_sync()`, `require_backward_grad_sync`) of a model the script did not wrap or "
    "used otherwise than in a `with` block would leave some gradients per process.",
    "out = model(x)\nloss_a(out).backward(retain_graph=True)\nloss_b(out).backward()",
    "Sum the losses and call one backward per forward, or use `with model.no_sync():` on the "
    "wrapped model only; or convert by hand.",
)
SCHEDULE_FROM_A_SHARD = Refusal(
    "ACR217",
    "schedule-from-a-shard",
    "a scheduler reads the length of a loader prepare() shards each time it runs",
    "A scheduler is sized from the length of the loader before prepare(), and the prepared "
    "scheduler steps once per process each step, so it runs that schedule on any number of "
    "processes. A `lr_lambda` (or a function of the file handed to the scheduler) that reads "
    "`len(loader)` each time it runs reads the prepared loader's length instead, one "
    "process's share: on N processes the schedule would end after 1/N of the training.",
    "scheduler = LambdaLR(\n    optimizer,\n"
    "    lambda step: cosine(step, epochs * len(train_loader)),\n)",
    "Bind the total to a name before the loader is prepared (`total_steps = epochs * "
    "len(train_loader)`) and read that name in the function, then convert again.",
)
DDP_LAUNCH = Refusal(
    "ACR301",
    "ddp-launch",
    "how the script starts or switches its processes is not a shape the rewrite knows",
    "A hand-written DDP script is rewritten to what it would be on one process. `mp.spawn` "
    "with options `accel-run` cannot take over, a spawned function also called directly or "
    "whose parameters do not match `args=`, a distributed/single-process switch read other "
    "than by `if`, or a set-up function used as a value cannot be rewritten safely.",
    "mp.spawn(main, args=make_args(), nprocs=world_size, join=False)",
    "Write the start as `torchrun` runs it (one process per GPU reading `LOCAL_RANK`, a plain "
    "`if ddp:` switch), then convert again; or convert by hand.",
)
DDP_WRAPPER = Refusal(
    "ACR302",
    "ddp-wrapper",
    "DistributedDataParallel's options or .module cannot carry over",
    "The `DDP(...)` wrapper goes and its options carry over as "
    "`DistributedDataParallelKwargs`. Options given by position, computed, different between "
    "models or without an Accelerate equivalent, or a `.module` of a model the rewrite cannot "
    "follow, cannot. `nn.DataParallel` goes too where it wraps the model only in an `if` whose "
    "other runs train the bare model, or on every path over whatever GPUs there are (one GPU "
    "then gets the whole batch, so the forward relies on no share). One told which GPUs "
    "(`device_ids=[0, 1]`: its forward may rely on each one's share), one whose own state "
    "dict the script saves or loads (keyed `module.`, which dropping it drops), one under an "
    "`if` whose `else` does something else, a script that reads the GPU count, or splitting "
    "the batch along another `dim=` cannot. A `.module` in a function is followed where every call "
    "of the function hands it a wrapped model. A file that "
    "wraps a model in `DataParallel` but never calls backward (a predictor class, an "
    "evaluation script) is not refused: it has nothing to convert.",
    "model = DDP(model, [rank], None, True)",
    "Pass the options by keyword with literal values, or set `DistributedDataParallelKwargs` "
    "in the accelerator by hand.",
)
DDP_SAMPLER = Refusal(
    "ACR303",
    "ddp-sampler",
    "a DistributedSampler the prepared loader cannot replace",
    "A prepared loader shards the data itself, so a `DistributedSampler` goes and the loader "
    "gets its `shuffle` (under a `BatchSampler`, it becomes the `RandomSampler` or "
    "`SequentialSampler` that shuffle stands for). One not handed straight to a `DataLoader` or "
    "through a `BatchSampler` to its `batch_sampler=`, given its own `num_replicas`/`rank` or "
    "options with no equivalent (`drop_last=True`), used other than by `set_epoch`, or on a "
    "loader the conversion would not prepare cannot go; a loader only evaluated keeps a "
    "non-shuffling sampler over its own dataset, told the accelerator's process count and "
    "index.",
    "sampler = DistributedSampler(ds, num_replicas=4, rank=args.rank)\n"
    "loader = DataLoader(ds, sampler=sampler)",
    "Hand the sampler straight to its `DataLoader` (or its `BatchSampler`) with only "
    "`shuffle=`/`seed=`, then convert again; or prepare the loader by hand.",
)
DDP_COLLECTIVE = Refusal(
    "ACR304",
    "ddp-collective",
    "a collective call with no accelerator equivalent",
    "`dist.all_reduce(t)` becomes `t = accelerator.reduce(t, 'sum')` only for a sum or mean of "
    "a named tensor on the default group, in a statement of its own. An expression, another "
    "reduction or a call whose result is used cannot be rewritten.",
    "dist.all_reduce(loss.detach(), op=dist.ReduceOp.MAX)",
    "Reduce into a name (`t = loss.detach(); dist.all_reduce(t)`) with a sum or mean, or call "
    "`accelerator.reduce`/`gather` by hand.",
)
DDP_RANK = Refusal(
    "ACR305",
    "ddp-rank",
    "a rank value with no place to read it from",
    "Rank reads (`LOCAL_RANK`, `dist.get_rank()`) become the accelerator's process indices. "
    "One read where neither the accelerator nor a process state built with the same `cpu=` "
    "choice can be reached has no source to take.",
    'rank = int(os.environ["RANK"])  # module level, before any accelerator\n'
    "class Logger:\n    enabled = rank == 0",
    "Read the rank inside the function that trains (after the accelerator exists), then "
    "convert again; or use `accelerator.process_index` by hand.",
)

REFUSALS: tuple[Refusal, ...] = (
    ALREADY_DISTRIBUTED,
    OTHER_PARALLELISM,
    TRAINER_AND_LOOP,
    UNPRINTABLE,
    NOTEBOOK_SPLIT,
    TRAINING_ELSEWHERE,
    NO_TRAINING,
    PROGRAM_SPLIT,
    CLOSURE,
    BUILT_IN_LOOP,
    SECOND_SETUP,
    STEP_OUTSIDE_SETUP,
    OBJECTS_NOT_FOLLOWED,
    UNTRACKED_USE,
    BUILD_ORDER,
    BARE_MODULE,
    HAND_PICKED_DEVICE,
    ACCELERATOR_UNREACHABLE,
    NAME_TAKEN,
    LOCKSTEP,
    ACCUMULATION,
    STEP_ORDER,
    MIXED_PRECISION,
    UNSYNCED_GRADIENTS,
    SCHEDULE_FROM_A_SHARD,
    DDP_LAUNCH,
    DDP_WRAPPER,
    DDP_SAMPLER,
    DDP_COLLECTIVE,
    DDP_RANK,
)
