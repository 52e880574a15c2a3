"""docker-compose.yml is closed by default (issue 36). tests/e2e/test_compose_stack.py starts it for real (with
docker-compose.local.yml, images built here); this file checks it as data, in make test: every image pinned, every published port on loopback unless the operator opens it,
every secret from .env (none written in the file), and authentication on Prefect and MLflow.

That the authentication works is shown on real servers: `make stack` (.ci/stack.sh) runs the same MLflow (basic-auth
app, PostgreSQL) and Prefect (basic-auth string) servers without Docker, and tests/e2e/test_team_stack.py signs in
to them, is refused without the credentials, and finds no secret in their databases. This file checks that the
compose file's server commands are those ones: the same programs, options and authentication settings, parsed from
both files (the hosts, ports and paths may differ)."""
import configparser
import re
import shlex
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
PROJECT_IMAGE = "${MCLPIPE_IMAGE:-mclpipe:latest}"
LOCAL = yaml.safe_load((REPO / "docker-compose.local.yml").read_text())["services"]


def env_of(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in (SERVICES[service].get("environment") or {}).items()}


def dotenv(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_image_is_pinned_to_a_release(service):
    spec = SERVICES[service]
    if spec["image"] == PROJECT_IMAGE:  # `make image`'s, built from this checkout
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
    # a checked password cached: without it every request pays two or three slow hashes (BENCHMARKS.md)
    assert 0 < ini.getint("mlflow", "auth_cache_ttl_seconds") <= 300


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


# ---------------------------------------------------------------------------------------------------- = make stack
def stack_command(server: str) -> tuple[dict[str, str], list[str]]:
    """(environment set on the command line, argv) of the server ``.ci/stack.sh start`` runs under ``nohup``."""
    script = (REPO / ".ci" / "stack.sh").read_text()
    block = script.split(f"if ! running {server}; then", 1)[1].split("\n    fi", 1)[0]
    words = shlex.split(block.replace("\\\n", " "))
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words.pop(0) == "nohup", words
    argv = [w for w in words[:next(i for i, w in enumerate(words) if w.startswith((">", "2>")) or w == "&")]]
    return env, [argv[0].rsplit("/", 1)[-1], *argv[1:]]


def stack_secret_names() -> set[str]:
    """The names .ci/stack.sh writes to .env, which it exports (set -a) to both servers."""
    script = (REPO / ".ci" / "stack.sh").read_text()
    return set(re.findall(r'"([A-Z_]+)": ', script.split("values = {", 1)[1].split("}\n", 1)[0]))


def compose_command(service: str) -> list[str]:
    """The server's argv in docker-compose.yml (after an ``sh -c "pip install ... &&"`` wrapper)."""
    argv = shlex.split(SERVICES[service]["command"])
    if argv[:2] == ["sh", "-c"]:
        argv = shlex.split(argv[2].split("&&")[-1])
    return argv


def options(argv: list[str]) -> dict[str, str]:
    """``--name value`` pairs of an argv (every option of these servers takes a value)."""
    return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}


def positional(argv: list[str]) -> list[str]:
    skip = {i + 1 for i, word in enumerate(argv) if word.startswith("--")}
    return [word for i, word in enumerate(argv) if i not in skip and not word.startswith("--")]


def database(uri: str) -> tuple[str, str]:
    """(scheme, database name) of a SQLAlchemy URI."""
    return uri.split("://", 1)[0], uri.rsplit("/", 1)[-1]


def test_compose_runs_the_mlflow_server_make_stack_runs():
    """The same program, app (basic-auth), options and authentication settings as .ci/stack.sh's MLflow server,
    whose sign-in test_team_stack.py exercises; the stack alone runs one worker, and the compose file's artifacts
    go to MinIO."""
    compose, (stack_env, stack) = compose_command("mlflow"), stack_command("mlflow")
    assert positional(compose) == positional(stack) == ["mlflow", "server"]
    assert set(options(compose)) == set(options(stack)) - {"--workers"}
    assert options(compose)["--app-name"] == options(stack)["--app-name"] == "basic-auth"
    assert database(options(compose)["--backend-store-uri"]) == database(options(stack)["--backend-store-uri"])
    auth = {name for name in env_of("mlflow") if name.startswith(("MLFLOW_AUTH_", "MLFLOW_FLASK_"))}
    assert auth == {"MLFLOW_AUTH_CONFIG_PATH", "MLFLOW_AUTH_ADMIN_USERNAME", "MLFLOW_AUTH_ADMIN_PASSWORD",
                    "MLFLOW_FLASK_SERVER_SECRET_KEY"}
    assert auth <= set(stack_env) | stack_secret_names()
    # both read their users' store and authorization function from the repository's basic-auth config
    assert 'config.read("deploy/mlflow-basic-auth.ini")' in (REPO / ".ci" / "stack.sh").read_text()
    assert SERVICES["mlflow"]["volumes"][0].startswith("./deploy/mlflow-basic-auth.ini:")


def test_compose_runs_the_prefect_server_make_stack_runs():
    """The same command and authentication string setting as .ci/stack.sh's Prefect server, on PostgreSQL."""
    compose, (stack_env, stack) = compose_command("prefect"), stack_command("prefect")
    assert positional(compose) == positional(stack) == ["prefect", "server", "start"]
    assert set(options(compose)) <= set(options(stack)) <= {"--host", "--port"}
    settings = {"PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_DATABASE_CONNECTION_URL",
                "PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_UI_API_URL", "PREFECT_UI_URL"}
    assert settings <= set(env_of("prefect")) and settings <= set(stack_env)
    assert env_of("prefect")["PREFECT_SERVER_API_AUTH_STRING"].startswith("${PREFECT_API_AUTH_STRING:?")
    assert stack_env["PREFECT_SERVER_API_AUTH_STRING"] == "$PREFECT_API_AUTH_STRING"
    assert "PREFECT_API_AUTH_STRING" in stack_secret_names()
    assert (database(env_of("prefect")["PREFECT_API_DATABASE_CONNECTION_URL"])
            == database(stack_env["PREFECT_API_DATABASE_CONNECTION_URL"]))


# --------------------------------------------------------------------------------------- = the image (Dockerfile)
def dockerfile_copies() -> set[str]:
    """The sources the Dockerfile copies into /src (COPY NAME /src/NAME)."""
    text = (REPO / "Dockerfile").read_text()
    return set(re.findall(r"^COPY (\S+) /src/\1$", text, flags=re.M))


def test_the_image_copies_every_package_the_project_installs():
    """A package pyproject.toml installs but the Dockerfile does not copy is missing from the image (`mclpipe` then
    fails at its first import: planning/ once did); .dockerignore must let it into the build context too."""
    import tomllib
    includes = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in includes}
    assert packages <= dockerfile_copies(), f"not copied: {sorted(packages - dockerfile_copies())}"
    allowed = {line[1:] for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    assert packages <= allowed


def test_the_build_context_is_the_sources_alone():
    """.dockerignore leaves everything out, then lets the sources back in: never the venv, runs, databases, .git or
    .env (a secret in an image layer is there for good)."""
    lines = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*"
    allowed = {line[1:] for line in lines if line.startswith("!")}
    assert not allowed & {".venv", "runs", "data", "mlflow.db", ".git", ".env", ".prefect", "mlruns", ".stack"}
    assert "wheelhouse/constraints.txt" in lines  # the host venv's versions: a change there rebuilds no layer


def test_the_image_runs_as_a_non_root_user_with_the_gpu_variables():
    text = (REPO / "Dockerfile").read_text()
    users = re.findall(r"^USER (\S+)$", text, flags=re.M)
    assert users and users[-1] == "mcl"
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in text  # without it the toolkit mounts no CUDA driver
    assert re.search(r"^ARG BASE=debian:bookworm-slim$", text, flags=re.M)


def test_the_local_override_replaces_every_image_that_would_be_pulled():
    """docker-compose.local.yml: every service of the stack on an image built on this machine (make image, or
    deploy/postgres.Dockerfile), the servers with the same programs as docker-compose.yml's."""
    for service, spec in SERVICES.items():
        image = LOCAL.get(service, {}).get("image", spec["image"])
        assert image in (PROJECT_IMAGE, "mclpipe-postgres:15"), f"{service} would pull {image}"
    assert compose_command("prefect") == shlex.split(SERVICES["prefect"]["command"])
    local_mlflow = shlex.split(LOCAL["mlflow"]["command"])
    assert positional(local_mlflow) == positional(compose_command("mlflow"))
    assert set(options(local_mlflow)) == set(options(compose_command("mlflow")))
    assert options(local_mlflow)["--app-name"] == "basic-auth"
    assert "ports" not in str(LOCAL)  # the base's loopback ports stay as they are


def test_the_gpu_reservation_is_its_own_override():
    gpu = yaml.safe_load((REPO / "docker-compose.gpu.yml").read_text())["services"]
    [device] = gpu["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "deploy" not in SERVICES["worker"]
    assert "docker-compose.gpu.yml" in dotenv(REPO / ".env.example")["COMPOSE_FILE"].split(":")
