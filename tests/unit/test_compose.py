"""docker-compose.yml is closed by default (issue 36). No Docker engine runs on the development machine or in CI, so
the file is checked as data: every image pinned, every published port on loopback unless the operator opens it,
every secret from .env (none written in the file), and authentication on Prefect and MLflow."""
import configparser
import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
SECRET_NAME = re.compile(r"PASSWORD|SECRET|AUTH_STRING|ACCESS_KEY")
# a ${VAR...} interpolation compose resolves from .env
FROM_ENV = re.compile(r"^\$\{[A-Z_][A-Z0-9_]*(:[?-][^}]*)?\}$")
USERINFO_PASSWORD = re.compile(r"://[^/\s:@]+:([^@\s]+)@")


def env_of(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in (SERVICES[service].get("environment") or {}).items()}


def dotenv(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_image_is_pinned_to_a_release(service):
    spec = SERVICES[service]
    if "build" in spec:
        return
    name, _, tag = spec["image"].rpartition(":")
    assert name and tag and tag != "latest", f"{service}: {spec['image']} is not pinned to a version"
    # a release, not a moving major line such as postgres:16
    assert re.search(r"\d+\.\d+|RELEASE\.\d{4}-", tag), f"{service}: {spec['image']} names no release"


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_published_ports_listen_on_loopback_unless_opened(service):
    for port in SERVICES[service].get("ports", []):
        host = str(port).rsplit(":", 2)[0]
        assert host in ("127.0.0.1", "${MCLPIPE_BIND_ADDRESS:-127.0.0.1}"), f"{service} publishes {port}"


def test_only_prefect_and_mlflow_can_be_opened():
    opened = {s for s, spec in SERVICES.items() if any("MCLPIPE_BIND_ADDRESS" in str(p) for p in spec.get("ports", []))}
    assert opened == {"prefect", "mlflow"}
    assert "ports" not in SERVICES["postgres"] and "ports" not in SERVICES["worker"]


def test_no_secret_is_written_in_the_file():
    for service, spec in SERVICES.items():
        for key, value in env_of(service).items():
            if SECRET_NAME.search(key):
                assert FROM_ENV.match(value), f"{service}.{key} is written in the file: take it from .env"
        texts = [*env_of(service).values(), str(spec.get("command", "")), str(spec.get("entrypoint", ""))]
        for text in texts:
            for password in USERINFO_PASSWORD.findall(text):
                assert FROM_ENV.match(password), f"{service}: a password in a URI: {text}"
    text = (REPO / "docker-compose.yml").read_text()
    assert "mclpipe-secret" not in text and "POSTGRES_PASSWORD: mclpipe" not in text


def test_prefect_and_mlflow_require_authentication():
    prefect, mlflow, worker = env_of("prefect"), env_of("mlflow"), env_of("worker")
    assert prefect["PREFECT_SERVER_API_AUTH_STRING"].startswith("${PREFECT_API_AUTH_STRING:?")
    assert worker["PREFECT_API_AUTH_STRING"].startswith("${PREFECT_API_AUTH_STRING:?")  # the same string
    assert "--app-name basic-auth" in SERVICES["mlflow"]["command"]
    assert "mlflow[auth]" in SERVICES["mlflow"]["command"]  # Flask-WTF, which the basic-auth app imports
    assert mlflow["MLFLOW_FLASK_SERVER_SECRET_KEY"].startswith("${MLFLOW_FLASK_SERVER_SECRET_KEY:?")
    assert mlflow["MLFLOW_AUTH_ADMIN_PASSWORD"].startswith("${MLFLOW_TRACKING_PASSWORD:?")
    assert worker["MLFLOW_TRACKING_PASSWORD"].startswith("${MLFLOW_TRACKING_PASSWORD:?")
    # the auth config mounted at MLFLOW_AUTH_CONFIG_PATH: a file of the repository, without a password
    [mount] = SERVICES["mlflow"]["volumes"]
    source, target, _ = mount.split(":")
    assert target == mlflow["MLFLOW_AUTH_CONFIG_PATH"]
    ini = configparser.ConfigParser()
    ini.read(REPO / source)
    assert ini["mlflow"]["database_uri"].startswith("postgresql") and "admin_password" not in ini["mlflow"]
    assert not USERINFO_PASSWORD.search(ini["mlflow"]["database_uri"])
    assert ini["mlflow"]["authorization_function"] == "mlflow.server.auth:authenticate_request_basic_auth"


def test_every_variable_is_in_env_example_with_a_placeholder():
    text = (REPO / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text))
    example = dotenv(REPO / ".env.example")
    assert used <= set(example), f"missing from .env.example: {sorted(used - set(example))}"
    for key, value in example.items():
        if SECRET_NAME.search(key):
            assert "replace-me" in value, f".env.example: {key} must be a placeholder"


def test_dot_env_is_never_committed():
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO)
    assert ignored.returncode == 0, ".env must be in .gitignore"


def test_mlflow_answers_the_host_names_its_clients_use():
    """MLflow refuses a Host header outside its allowed hosts (DNS-rebinding protection; by default localhost and
    private IPs): the worker reaches it as mlflow:5000."""
    allowed = env_of("mlflow")["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    worker_host = env_of("worker")["MLFLOW_TRACKING_URI"].split("://")[1]
    assert worker_host in allowed and "localhost:5000" in allowed
    assert "*" not in allowed
