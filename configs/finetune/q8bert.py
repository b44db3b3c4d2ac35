"""Q8BERT (Zafrir et al. 2019): 8-bit quantization-aware fine-tuning on any classification task.

    python -m bertology.finetune --config configs/finetune/q8bert.py:embedded \
        --config.init_checkpoint=runs/tiny --workdir runs/q8_embedded

The argument is the task. Every Dense (Q, K, V, attention output, FFN, pooler, head) and every
embedding table is fake-quantized to symmetric int8 while fine-tuning (`bertology.train.quantize`);
the run writes `int8_params.msgpack` and reports `int8_bytes` against `float32_bytes`.
`python -m benchmarks.quantized` measures int8 against float32 inference on this machine.
"""

from bertology.train.finetune import default_config

# The presets get_config takes; tests run each through validation.
PRESETS = ("embedded", "sst2")


def get_config(task: str = "embedded"):
    c = default_config(task)
    c.quantize = "int8"
    if task == "embedded":  # the small-model recipe of configs/finetune/embedded.py
        c.epochs, c.data.max_seq_length, c.optimizer.learning_rate = 5, 64, 1e-3
    else:
        c.optimizer.learning_rate = 2e-5
    return c
