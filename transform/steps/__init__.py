"""One module per conversion step; :mod:`accelify.transform.convert` runs them in this order.

The uses and lockstep steps edit nothing: they refuse a setup with a use of a prepared object
that no step keeps right, or a training step not every process runs. They come after the steps
whose own refusals say more precisely what stops a conversion.

The amp, accumulate and cpu_choice steps come first because they decide the
``Accelerator(...)`` arguments, which fix where it can be created (``place``); every later step
may only use it after that point. Writing the accelerator and handing it to other functions come
last because every other step may ask for it.
"""

from accelify.transform.plan import Step
from accelify.transform.steps.accelerator import accelerator, place
from accelify.transform.steps.accumulate import accumulate
from accelify.transform.steps.amp import amp
from accelify.transform.steps.backward import backward
from accelify.transform.steps.clip import clip
from accelify.transform.steps.cpu_choice import cpu_choice
from accelify.transform.steps.device import device
from accelify.transform.steps.lockstep import lockstep
from accelify.transform.steps.metrics import metrics
from accelify.transform.steps.moves import moves
from accelify.transform.steps.output import output
from accelify.transform.steps.prepare import prepare
from accelify.transform.steps.save import save
from accelify.transform.steps.seed import seed
from accelify.transform.steps.thread import thread
from accelify.transform.steps.unwrap import unwrap
from accelify.transform.steps.uses import uses
from accelify.transform.steps.writes import writes

STEPS: list[Step] = [
    amp,
    accumulate,
    cpu_choice,
    place,
    device,
    moves,
    prepare,
    unwrap,
    backward,
    clip,
    save,
    writes,
    metrics,
    output,
    seed,
    uses,
    lockstep,
    accelerator,
    thread,
]
