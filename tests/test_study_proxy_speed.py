"""The study's instrument of its own cost (study/findings/proxy_speed.py): train.py's step on a proxy,
timed, in tokens/s and GFLOP/s against the machine's matmul rate."""

from study.findings import proxy_speed


def test_the_proxys_speed_is_measured_and_printed(capsys):
    proxy_speed.main(["--models", "proxy-100k", "--micro-batch", "2", "--optimizers", "adamw",
                      "--threads", "1", "--steps", "1"])  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("device: cpu (") and out[1].startswith("threads 1: fp32 matmul")
    assert "proxy-100k  micro   2 adamw" in out[2] and "tokens/s" in out[2]
