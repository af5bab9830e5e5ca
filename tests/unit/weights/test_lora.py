"""LoRA on a tiny local model: only the adapter trains, it saves alone, and the loader the engine
serves with loads exactly the model the trainer holds; serving and training find an adapter's base
the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch

from fulgor.adapters import Trajectory, TrajectoryRow
from fulgor.algorithms.grpo import GRPO, GRPOConfig
from fulgor.algorithms.grpo.update import PolicyUpdater
from fulgor.engine.models import init_model
from fulgor.errors import ConfigError
from fulgor.weights.errors import ModelLoadError
from fulgor.weights.loading import load_model
from fulgor.weights.lora import LoraConfig, adapter_base, load_adapter
from fulgor.weights.policy import load_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")
IDS = torch.tensor([[5, 6, 7, 20, 30, 8]])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("lora") / "tiny", "tiny", seed=0)


def trajectory(index: int) -> Trajectory:
    row = TrajectoryRow(
        token_ids=[5, 6, 7 + index, 20 + index, 30],
        loss_mask=[0, 0, 0, 1, 1],
        sampled_logprobs=[0.0, 0.0, 0.0, -2.0, -2.0],
        calls=[0],
        returns=[0.0] * 5,
    )
    return Trajectory(f"r{index}", "g", float(index % 2), [row], model_versions=[])


def test_only_the_adapter_trains_and_only_the_adapter_is_saved(tmp_path: Path, model_dir: Path) -> None:
    policy = load_policy(model_dir, "cpu", LoraConfig(rank=4, target_modules=("q_proj", "v_proj")))
    before = {name: p.detach().clone() for name, p in policy.model.named_parameters()}
    trainable = {name for name, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable
    assert all("lora_" in name for name in trainable)

    PolicyUpdater(policy.model, GRPOConfig(learning_rate=1e-2)).step([trajectory(0), trajectory(1)])
    for name, parameter in policy.model.named_parameters():
        changed = not torch.equal(parameter, before[name])
        assert changed == (name in trainable and "lora_B" in name), name  # A moves only once B is not 0

    policy.model.save_pretrained(tmp_path / "adapter")
    saved = sorted(p.name for p in (tmp_path / "adapter").iterdir())
    assert saved == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(model_dir.resolve())
    assert (config["r"], sorted(config["target_modules"])) == (4, ["q_proj", "v_proj"])

    # The engine's loader merges the adapter into the base: the same logits as the trainer's model.
    served = load_model(tmp_path / "adapter", device="cpu", dtype="float32")
    assert served.kind == "lora"
    policy.model.eval()
    with torch.no_grad():
        expected = policy.model(input_ids=IDS).logits
        base = load_model(model_dir, device="cpu", dtype="float32").model(input_ids=IDS).logits
        assert torch.allclose(served.model(input_ids=IDS).logits, expected, atol=1e-5)
    assert not torch.allclose(base, expected, atol=1e-5)


def test_an_adapter_continues_only_with_its_own_shape(tmp_path: Path, model_dir: Path) -> None:
    policy = load_policy(model_dir, "cpu", LoraConfig(rank=4))
    policy.model.save_pretrained(tmp_path / "adapter")
    policy.tokenizer.save_pretrained(tmp_path / "adapter")

    resumed = load_policy(tmp_path / "adapter", "cpu", LoraConfig(rank=4))
    assert any(p.requires_grad for name, p in resumed.model.named_parameters() if "lora_" in name)
    assert not any(p.requires_grad for name, p in resumed.model.named_parameters() if "lora_" not in name)
    with pytest.raises(ConfigError, match="rank 4"):
        load_adapter(load_model(model_dir, device="cpu").model, tmp_path / "adapter", LoraConfig(rank=8))
    with pytest.raises(ConfigError, match="GRPO\\(lora=LoraConfig"):
        load_policy(tmp_path / "adapter", "cpu")
    with pytest.raises(ConfigError, match="target_modules"):
        load_policy(model_dir, "cpu", LoraConfig(target_modules=("no_such_proj",)))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"rank": 0}, "rank"),
        ({"alpha": 0}, "alpha"),
        ({"dropout": 1.0}, "dropout"),
        ({"target_modules": ()}, "target_modules"),
    ],
)
def test_bad_lora_settings_fail_early(options: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        LoraConfig(**options)  # type: ignore[arg-type]


def test_lora_settings_are_among_the_hyperparameters() -> None:
    settings = GRPO(lora=LoraConfig(rank=2)).hyperparameters()
    assert settings["lora/rank"] == 2
    assert settings["config/learning_rate"] == GRPOConfig().learning_rate
    assert "lora/rank" not in GRPO().hyperparameters()


def test_by_default_every_linear_layer_but_the_output_head_gets_an_adapter(model_dir: Path) -> None:
    base = load_model(model_dir, device="cpu", dtype="float32").model
    linear = {name for name, module in base.named_modules() if isinstance(module, torch.nn.Linear)}
    assert "lm_head" in linear

    policy = load_policy(model_dir, "cpu", LoraConfig(rank=4))
    adapted = {
        name.removeprefix("base_model.model.")
        for name, module in policy.model.named_modules()
        if hasattr(module, "lora_A")
    }
    assert adapted == linear - {"lm_head"}


def agent_rows(agent: str, index: int) -> Trajectory:
    """A rollout whose one row is ``agent``'s."""
    made = trajectory(index)
    made.rows[0].agent_name = agent
    return made


def lora_params(model: torch.nn.Module, adapter: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{adapter}." in n}


def test_one_adapter_per_agent_trains_each_on_its_own_agents_rows_only(
    tmp_path: Path, model_dir: Path
) -> None:
    adapters = {"write": LoraConfig(rank=4), "rewrite": LoraConfig(rank=2)}
    policy = load_policy(model_dir, "cpu", adapters=adapters)
    updater = GRPO(adapters=adapters, config=GRPOConfig(learning_rate=1e-2)).updater(policy.model)
    before = {name: lora_params(policy.model, name) for name in adapters}
    # Only the writer made calls this step: the rewriter's adapter stays as it was.
    metrics = updater.step([agent_rows("write_query", 0), agent_rows("write_query", 1)])
    assert metrics["trained_tokens/write"] == 4
    assert "trained_tokens/rewrite" not in metrics
    after = {name: lora_params(policy.model, name) for name in adapters}
    assert any(not torch.equal(after["write"][n], before["write"][n]) for n in before["write"])
    assert all(torch.equal(after["rewrite"][n], before["rewrite"][n]) for n in before["rewrite"])
    # rewrite_query starts with 'rewrite' (the longest name), not with 'write'.
    metrics = updater.step([agent_rows("rewrite_query", 0), agent_rows("rewrite_query", 1)])
    assert metrics["trained_tokens/rewrite"] == 4
    assert metrics["trained_tokens"] == 4

    policy.save(tmp_path / "checkpoints", 1, {"updater": updater.state_dict()})
    checkpoint = tmp_path / "checkpoints" / "step-1"
    marker = json.loads((checkpoint / "adapters.json").read_text())
    assert marker == {"base": str(model_dir.resolve()), "adapters": ["write", "rewrite"]}
    resumed = load_policy(checkpoint, "cpu", adapters=adapters)
    for name in adapters:
        saved = lora_params(resumed.model, name)
        assert all(torch.equal(saved[n], lora_params(policy.model, name)[n]) for n in saved)
    GRPO(adapters=adapters).updater(resumed.model).load_state_dict(updater.state_dict())
    with pytest.raises(ConfigError, match="adapters \\['rewrite', 'write'\\], but \\['write'\\]"):
        load_policy(checkpoint, "cpu", adapters={"write": LoraConfig(rank=4)})
    with pytest.raises(ConfigError, match="one LoRA adapter per agent"):
        load_policy(checkpoint, "cpu")


def test_adapters_per_agent_are_checked_and_choose_the_agents_trained() -> None:
    grpo = GRPO(adapters={"write": LoraConfig(), "rewrite": LoraConfig(rank=2)})
    assert grpo.agent_match == "^(?:rewrite|write)"
    assert grpo.metric_names["policy_loss/rewrite"] == "loss/rewrite"
    assert grpo.hyperparameters()["adapters/rewrite/rank"] == 2
    with pytest.raises(ConfigError, match="not both"):
        GRPO(lora=LoraConfig(), adapters={"write": LoraConfig()})
    with pytest.raises(ConfigError, match="leave agent_match unset"):
        GRPO(agent_match="write", adapters={"write": LoraConfig()})
    with pytest.raises(ConfigError, match="adapter name 'write\\|rewrite'"):
        GRPO(adapters={"write|rewrite": LoraConfig()})


def test_serving_and_training_find_an_adapters_base_alike(tmp_path: Path, model_dir: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    config = {"base_model_name_or_path": str(model_dir), "r": 8, "lora_alpha": 16.0}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    assert adapter_base(adapter) == model_dir
    assert adapter_base(adapter, tmp_path / "elsewhere") == tmp_path / "elsewhere"  # given, not read

    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "org/hub"}))
    with pytest.raises(ModelLoadError, match="names base model 'org/hub', which is not a local directory"):
        load_model(adapter, device="cpu")
    with pytest.raises(ModelLoadError, match="names base model 'org/hub', which is not a local directory"):
        load_policy(adapter, "cpu", LoraConfig())
