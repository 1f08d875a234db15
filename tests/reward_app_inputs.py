"""What the reward-app tests share (tests/test_reward_app.py, tests/test_reward_app_http.py):
six rendered shapes with their prompts, a token the server accepts, and the settings of an
app serving shapes_oracle and jpeg_compressibility."""

from g2rpo.common.prompts.shapes import all_combinations, render_batch
from g2rpo.reward_server.settings import ScorerSpec, ServerSettings

SPECS = all_combinations()[:6]
SECRET = "9f2c4e1a7b3d5f60" * 4  # a reward token the server accepts (32 bytes or more)
IMAGES = render_batch(SPECS, seed=0)
PROMPTS = [s.prompt for s in SPECS]


def _settings(**kw):
    names = ["shapes_oracle", "jpeg_compressibility"]
    return ServerSettings(scorers=[ScorerSpec(name=n) for n in names], **kw)
