"""`capi-gpu cost --plot`: the chart is rendered (SVG with searchable text, PNG) and agrees with the text report:
the leased figures at each utilization, the break-evens against each cloud offer (where the curves really cross),
hourly billing's limit, the seed's €1.22 / €7.41 / €1.42, the per-slice-hour curve, the measured-utilization
mark; a file name that is neither .svg nor .png is a usage error before any work."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from matplotlib.lines import Line2D

from capi_gpu import cli, pricing
from capi_gpu.cli import cost_plot


def report_and_svg(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> tuple[str, str]:
    capsys.readouterr()
    svg = tmp_path / "pricing.svg"
    assert cli.main(["cost", *argv, "--plot", str(svg)]) == 0
    out, err = capsys.readouterr()
    assert f"chart written to {svg}" in err
    texts = [el.text or "" for el in ET.parse(svg).iter() if el.tag.endswith("text")]
    return out, "\n".join(texts)


def row(out: str, label: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(label))
    return line[len(label) :].split()


def line(fig: object, label_start: str) -> Line2D:
    ax = fig.axes[0]  # type: ignore[attr-defined]
    return next(ln for ln in ax.lines if str(ln.get_label()).startswith(label_start))


def value_at(ln: Line2D, pct: float) -> float:
    """The curve's y at x, interpolated in log space (the y axis is logarithmic)."""
    xs, ys = (list(map(float, a)) for a in ln.get_data())
    i = next(i for i in range(1, len(xs)) if xs[i] >= pct)
    t = (pct - xs[i - 1]) / (xs[i] - xs[i - 1])
    return math.exp(math.log(ys[i - 1]) + t * (math.log(ys[i]) - math.log(ys[i - 1])))


def test_chart_carries_the_numbers_the_text_report_prints(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out, svg = report_and_svg(capsys, tmp_path)
    for pct, figure in zip(row(out, "utilization"), row(out, "leased: per used GPU-hour"), strict=True):
        assert f"{pct}: {figure}" in svg  # 16%: €13.89, 50%: €4.44, 100%: €2.22
    for be in re.findall(r"cheaper above ([0-9.]+%) utilization", out):
        assert f"break-even {be}" in svg  # 77.4% (Scaleway), 61.7% (Cloud Run L4)
    assert len(re.findall(r"break-even", svg)) == 2
    below = re.search(r"cheaper only below ([0-9.]+) used hours", out)
    assert below and f"hourly billing cheaper below {below.group(1)} h" in svg
    seed = re.search(r"seed check: €889/month = (€[0-9.]+)/h at 730 h, (€[0-9.]+)/h at 120 h used", out)
    assert seed and (seed.group(1), seed.group(2)) == ("€1.22", "€7.41")
    assert f"seed {seed.group(1)} at 730 h" in svg and f"seed {seed.group(2)} at 120 h" in svg
    assert "seed hourly billing €1.42/h" in svg  # 889 / 624 = 1.4247
    for name in ("Scaleway H100-1-80G (1 GPU): €2.87", "Cloud Run L4 (4 vCPU, 16 GiB) (x4 per GPU): €3.60"):
        assert name in svg
    assert "same host shared by 4 MIG slices, per used slice-hour" in svg
    assert "2026-10-08" in svg and "measured utilization" not in svg


def test_curves_cross_where_the_report_says() -> None:
    price, terms, fx = pricing.GEX131_OCT_2026, pricing.Terms(), pricing.DEFAULT_FX
    scenarios = [pricing.scenario(price, terms, u, pricing.DEFAULT_OFFERS, fx) for u in (0.16, 0.5, 1.0)]
    fig = cost_plot.figure(price, terms, fx, pricing.DEFAULT_OFFERS, scenarios)
    leased, sliced = line(fig, "leased GEX131"), line(fig, "same host shared")
    for s in scenarios:
        assert s.leased_per_used_gpu_hour is not None and s.leased_per_used_slice_hour is not None
        assert value_at(leased, s.utilization * 100) == pytest.approx(s.leased_per_used_gpu_hour, rel=0.01)
        assert value_at(sliced, s.utilization * 100) == pytest.approx(s.leased_per_used_slice_hour, rel=0.01)
    for offer in pricing.DEFAULT_OFFERS:
        flat = line(fig, offer.name)
        rate = pricing.cloud_eur_per_gpu_hour(offer, fx)
        assert [float(y) for y in flat.get_ydata()] == pytest.approx([rate, rate])  # type: ignore[union-attr]
        be = pricing.break_even_utilization(price, terms, offer, fx)
        assert value_at(leased, be * 100) == pytest.approx(rate, rel=0.01)  # the curves meet at the mark
    hourly = line(fig, "Hetzner hourly billing")
    assert value_at(hourly, 50) == pytest.approx(scenarios[1].hourly_per_used_gpu_hour, rel=0.01)
    seed = line(fig, "seed: GEX131 at launch")
    assert value_at(seed, 100) == pytest.approx(1.22, abs=0.005)
    assert value_at(seed, 120 / 730 * 100) == pytest.approx(7.41, abs=0.05)


def test_measured_utilization_is_marked(tmp_path: Path) -> None:
    price, terms, fx = pricing.GEX131_OCT_2026, pricing.Terms(), pricing.DEFAULT_FX
    fig = cost_plot.figure(price, terms, fx, pricing.DEFAULT_OFFERS, [], measured=0.3125)
    mark = line(fig, "measured utilization 31.2%")
    assert [float(x) for x in mark.get_xdata()] == [31.25, 31.25]  # type: ignore[union-attr]
    png = tmp_path / "m.png"
    cost_plot.save(fig, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_png_from_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "seed.PNG"
    assert cli.main(["cost", "--monthly", "889", "--setup", "0", "--used-hours", "120", "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_plot_file_that_is_not_svg_or_png_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    capsys.readouterr()
    assert cli.main(["cost", "--plot", str(tmp_path / "chart.pdf")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "must end in .svg or .png" in err
    assert not (tmp_path / "chart.pdf").exists()
