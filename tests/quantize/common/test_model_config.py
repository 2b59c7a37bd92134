"""What quantize.common.model_config reads from a config.json."""
import pytest

from quantize.common.model_config import context_length


@pytest.mark.parametrize("config, positions", [
    ({"n_positions": 1024, "n_ctx": 1024}, 1024),                   # GPT-2, GPT-J, CodeGen, StarCoder
    ({"n_ctx": 2048}, 2048),                                         # older GPT-2-style files
    ({"max_seq_len": 32768}, 32768),                                 # DBRX, MPT
    ({"seq_length": 32768, "padded_vocab_size": 65024}, 32768),      # ChatGLM
    ({"max_sequence_length": 4096}, 4096),
    ({"model_max_length": 1048576}, 1048576),                        # Kimi-Linear
    ({"n_positions": 2048, "max_seq_len": 1024}, 1024),              # the fewest, as vLLM serves it
    ({"text_config": {"n_positions": 512}}, 512),
    # Llama-style configs keep max_position_embeddings, whatever else they carry
    ({"max_position_embeddings": 32768, "seq_length": 8192}, 32768),
    ({"n_positions": True}, None),
], ids=["gpt2", "n_ctx", "max_seq_len", "seq_length", "max_sequence_length", "model_max_length", "fewest",
        "text_config", "llama_first", "not_a_number"])
def test_configs_without_max_position_embeddings_give_their_context(config, positions):
    assert context_length(config) == positions
