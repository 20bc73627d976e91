"""What every ``export hf`` / ``import hf`` folder shares, whichever family writes it: the command names in its
output marker and the dtypes it can be written in. Both writers (:mod:`.convert` and ELECTRA's two folders,
:mod:`.electra`) take them from here; the tokenizer files beside the weights are the family's
(``Family.save_tokenizer``)."""

from __future__ import annotations

import torch

EXPORT_COMMAND, IMPORT_COMMAND = "export hf", "import hf"  # the names in each output folder's marker

EXPORT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
