"""docs/ui.md's pictures: curated, small copies of the screenshots `make ui-check` saves (cropped to the page
without MLflow's assistant panel, 820 px wide, 96 colours; about 350 KB for all).

    make ui-check && .venv/bin/python scripts/docs_ui_images.py        # runs/ui-check -> docs/images/ui
"""
import sys
from pathlib import Path
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
src = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "runs" / "ui-check"
dst = Path(sys.argv[2]) if len(sys.argv) > 2 else REPO / "docs" / "images" / "ui"
dst.mkdir(parents=True, exist_ok=True)
PICKS = {  # docs name: (ui-check name, crop right edge: MLflow's assistant panel starts at x=1040)
    "01-prefect-deployment": ("10-prefect-deployment", 1400),
    "02-prefect-custom-run-form": ("11-prefect-custom-run-form", 1400),
    "03-prefect-flow-run": ("12-prefect-custom-flow-run", 1400),
    "04-prefect-artifacts": ("02-prefect-artifacts", 1400),
    "05-prefect-link-artifact": ("03-prefect-link-artifact", 1400, 420),
    "06-mlflow-pipeline-run": ("13-mlflow-custom-run", 1040),
    "07-mlflow-plot": ("14-mlflow-plot", 1040),
    "08-mlflow-stage-run": ("05-mlflow-stage-run", 1040),
    "09-mlflow-stage-artifacts": ("06-mlflow-stage-artifacts", 1040),
    "10-mlflow-logged-models": ("08-mlflow-logged-models", 1040),
    "11-mlflow-registered-model": ("15-mlflow-registered-model", 1040),
    "12-prefect-crashed-flow-run": ("16-prefect-crashed-flow-run", 1400, 520),
    "13-prefect-retry": ("17-prefect-retry", 1400, 640),
}
total = 0
for name, (source, right, *bottom) in PICKS.items():
    image = Image.open(src / f"{source}.png").convert("RGB")
    image = image.crop((0, 0, min(right, image.width), min(bottom[0] if bottom else 1000, image.height)))
    width = 820
    image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    image = image.quantize(colors=96, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = dst / f"{name}.png"
    image.save(out, optimize=True)
    total += out.stat().st_size
    print(f"{out.name}: {image.size} {out.stat().st_size // 1024} KB")
print(f"total {total // 1024} KB")
