set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=2
python3 - <<'PY'
import torch
from transformers import LlamaConfig, LlamaForCausalLM, AutoTokenizer
torch.manual_seed(0)
c = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=1,
                eos_token_id=2, pad_token_id=2)
LlamaForCausalLM(c).save_pretrained("/tmp/m")
AutoTokenizer.from_pretrained(".gputok").save_pretrained("/tmp/m")
PY
/usr/bin/time -v python3 -m esft.cli bench --model /tmp/m --workloads decode-heavy --threads 2 --population 2 --no-naive --no-inference --no-vllm --json 2>&1 | tee $OUT/amx_bench.log
