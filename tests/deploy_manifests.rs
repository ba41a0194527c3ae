//! The deployment manifests users apply, checked offline against the Kubernetes
//! schemas and against the configuration they run. `ops/k8s` is rendered with
//! `kubectl kustomize` (base and the example overlay) and validated with
//! `kubernetes-validate --strict` (pinned by ops/deps.sh); ServiceMonitor, a
//! CRD without a core schema, is checked field by field. Then what binds the
//! manifests to the config: the grace period outlasts preStop + stop_timeout,
//! probes and ports name `http.bind`, the pool budget is the cluster's (never
//! replicas × pools), every `CABINE__` variable is a key `cabine check-config`
//! accepts (and a misspelt one is refused), every file the config names comes
//! from a mounted Secret, and the network policy lets the pod reach each store
//! and ICOM port the config names. `ops/ecs/task-definition.json` is read the same way.

mod cluster_support;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cabine::config::Settings;
use cabine::harness::TestPki;
use serde_json::Value;

use cluster_support::exe;

/// What the kubelet's SIGKILL must leave besides preStop and the pod's own stop budget.
const GRACE_MARGIN: Duration = Duration::from_secs(5);
/// The image's user (ops/container).
const IMAGE_UID: u64 = 65532;
/// Where the image reads its configuration (`CABINE_CONFIG_DIR`).
const CONFIG_DIR: &str = "/etc/cabine/config";
/// Under which the config and the TLS files are mounted (ECS: one volume there).
const MOUNT_ROOT: &str = "/etc/cabine";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(program: &str, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .current_dir(root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} (ops/deps.sh installs it): {e}"));
    child.stdin.take().expect("piped").write_all(stdin.unwrap_or_default().as_bytes()).expect("stdin");
    let out = child.wait_with_output().expect("waiting");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{program} {args:?}:\n{text}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl kustomize` of a directory under ops/k8s (the ConfigMap's file lives in config/).
fn render(dir: &str) -> String {
    run("kubectl", &["kustomize", "--load-restrictor", "LoadRestrictionsNone", &format!("ops/k8s/{dir}")], None)
}

/// The rendered YAML stream as JSON objects (PyYAML, which kubernetes-validate brings).
fn objects(yaml: &str) -> Vec<Value> {
    let to_json = "import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)";
    serde_json::from_str(&run("python3", &["-c", to_json], Some(yaml))).expect("JSON from the YAML")
}

fn kind<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind} rendered"))
}

#[test]
fn every_rendered_manifest_passes_the_kubernetes_schemas() {
    for dir in ["base", "overlays/example"] {
        let file = tempfile::NamedTempFile::new().expect("a temporary file");
        std::fs::write(file.path(), render(dir)).expect("writing the rendering");
        let path = file.path().to_str().expect("a UTF-8 path");
        // 1.30: the oldest release whose preStop `sleep` is on by default.
        for version in ["1.30.0", "1.37.0"] {
            let report = run("kubernetes-validate", &["--strict", "-k", version, path], None);
            let passed = report.lines().filter(|l| l.contains(" passed for resource ")).count();
            assert_eq!(passed, 6, "{dir} against {version}:\n{report}");
            assert!(!report.contains("ERROR") && !report.contains("failed"), "{dir} against {version}:\n{report}");
        }
    }
}

#[test]
fn the_service_monitor_scrapes_the_metrics_port_the_service_names() {
    let objects = objects(&render("overlays/example"));
    let (monitor, service) = (kind(&objects, "ServiceMonitor"), kind(&objects, "Service"));
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
    // It selects Services by their labels.
    let labels = service["metadata"]["labels"].as_object().expect("the Service's labels");
    let wanted = monitor["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels");
    assert!(!wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v)), "{wanted:?} ⊄ {labels:?}");
}

/// A pod's view of its files, under a temporary root: the config directory with
/// `production.toml` (its `/etc/cabine` paths moved under the root) and a PEM file
/// at every path the config names, by file name (CA, certificate, key).
struct PodFiles {
    root: tempfile::TempDir,
    _pki: TestPki,
}

impl PodFiles {
    fn new(production_toml: &str, mounted: &[String]) -> PodFiles {
        let root = tempfile::tempdir().expect("a temporary root");
        let pki = TestPki::generate().expect("test certificates");
        let local = |path: &str| root.path().join(path.trim_start_matches('/'));
        let config_dir = local(CONFIG_DIR);
        std::fs::create_dir_all(&config_dir).expect("the config dir");
        let moved = root.path().join(MOUNT_ROOT.trim_start_matches('/'));
        let text = production_toml.replace(&format!("\"{MOUNT_ROOT}/"), &format!("\"{}/", moved.display()));
        std::fs::write(config_dir.join("production.toml"), text).expect("production.toml");
        for path in mounted {
            let source = match Path::new(path).file_name().and_then(|n| n.to_str()) {
                Some("ca.pem") => &pki.ca,
                Some("tls.crt") => &pki.client_cert,
                Some("tls.key") => &pki.client_key,
                other => panic!("{path}: no PEM of that name ({other:?})"),
            };
            std::fs::create_dir_all(local(path).parent().expect("a parent")).expect("the mount dir");
            std::fs::copy(source, local(path)).expect("a PEM file");
        }
        PodFiles { root, _pki: pki }
    }

    fn config_dir(&self) -> PathBuf {
        self.root.path().join(CONFIG_DIR.trim_start_matches('/'))
    }

    /// `cabine check-config` with exactly `env` (and this config dir): exit code and output.
    fn check_config(&self, env: &HashMap<String, String>) -> (Option<i32>, String) {
        let out = Command::new(exe())
            .arg("check-config")
            .env_clear()
            .envs(env)
            .env("CABINE_CONFIG_DIR", self.config_dir())
            .output()
            .expect("cabine check-config runs");
        (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }

    /// The effective settings `env` gives, as the pod loads them.
    fn settings(&self, env: &HashMap<String, String>) -> Settings {
        Settings::load_with(&self.config_dir(), env).expect("the pod's configuration loads")
    }
}

/// The absolute paths `production.toml` names under the config dir (TLS files).
fn config_files(production_toml: &str) -> Vec<String> {
    let prefix = format!("\"{MOUNT_ROOT}/");
    let mut files = BTreeSet::new();
    for line in production_toml.lines().filter(|l| !l.trim_start().starts_with('#')) {
        if let Some(at) = line.find(&prefix) {
            files.insert(line[at + 1..].trim_end().trim_end_matches('"').to_owned());
        }
    }
    files.into_iter().collect()
}

/// A Kubernetes container's environment as the kubelet would set it: literal values,
/// a long dummy per Secret reference, the pod's name for a field reference.
fn container_env(container: &Value) -> HashMap<String, String> {
    let env = container["env"].as_array().expect("the container's env");
    env.iter()
        .map(|e| {
            let name = e["name"].as_str().expect("an env name").to_owned();
            let value = match (&e["value"], &e["valueFrom"]) {
                (Value::String(v), _) => v.clone(),
                (_, from) if from.get("secretKeyRef").is_some() => format!("secret-{name}-0123456789abcdef"),
                (_, from) if from.get("fieldRef").is_some() => "cabine-6f7c9d-x2k4p".to_owned(),
                _ => panic!("{name}: neither a value nor a Secret or field reference"),
            };
            (name, value)
        })
        .collect()
}

fn the_stores_and_icom_ports(settings: &Settings) -> BTreeSet<u64> {
    let port = |url: &str| reqwest::Url::parse(url).ok().and_then(|u| u.port()).map(u64::from);
    let mut urls = vec![settings.redis.url.clone(), settings.postgres.url.clone(), settings.nats.url.clone()];
    urls.extend(settings.icom.channels.values().filter(|c| c.enabled).map(|c| c.base_url.clone()));
    urls.iter().map(|u| port(u).unwrap_or_else(|| panic!("{u}: no explicit port"))).collect()
}

fn seconds(v: &Value) -> Duration {
    Duration::from_secs(v.as_u64().unwrap_or_else(|| panic!("{v}: not whole seconds")))
}

#[test]
fn the_deployment_is_bound_to_the_config_it_runs() {
    let objects = objects(&render("overlays/example"));
    let deployment = kind(&objects, "Deployment");
    let spec = &deployment["spec"]["template"]["spec"];
    let container = &spec["containers"][0];
    let production = kind(&objects, "ConfigMap")["data"]["production.toml"].as_str().expect("production.toml");
    let shipped = std::fs::read_to_string(root().join("config/production.toml")).expect("config/production.toml");
    assert_eq!(production, shipped, "the ConfigMap is config/production.toml");

    let env = container_env(container);
    assert_eq!(env.get("CABINE_ENV").map(String::as_str), Some("production"));
    assert_eq!(env.get("CABINE_CONFIG_DIR").map(String::as_str), Some(CONFIG_DIR));
    let files = PodFiles::new(production, &secret_files(spec, container, &config_files(production)));
    let (code, output) = files.check_config(&env);
    assert_eq!(code, Some(0), "check-config refuses the Deployment's environment:\n{output}");
    let mut misspelt = env.clone();
    misspelt.insert("CABINE__TIMING__LEAS".into(), "2s".into());
    assert_eq!(files.check_config(&misspelt).0, Some(64), "a key check-config does not know is refused");
    let settings = files.settings(&env);

    // SIGKILL never cuts a drain short.
    let grace = seconds(&spec["terminationGracePeriodSeconds"]);
    let pre_stop = seconds(&container["lifecycle"]["preStop"]["sleep"]["seconds"]);
    assert!(grace > pre_stop + settings.timing.stop_timeout + GRACE_MARGIN, "grace {grace:?} too short");

    // Probes and the ports name http.bind; the operator endpoints are not exposed.
    let bind = settings.http.bind.port();
    let http = &container["ports"][0];
    assert_eq!((http["name"].as_str(), http["containerPort"].as_u64()), (Some("http"), Some(u64::from(bind))));
    assert_eq!(container["ports"].as_array().map(Vec::len), Some(1));
    assert!(settings.http.operator_addr().ip().is_loopback(), "operator endpoints beyond loopback");
    for (probe, path) in
        [("startupProbe", "/health/live"), ("livenessProbe", "/health/live"), ("readinessProbe", "/health/ready")]
    {
        assert_eq!(container[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"], "http", "{probe}");
    }
    assert_eq!(kind(&objects, "Service")["spec"]["ports"][0]["targetPort"], "http");

    // The budget is the cluster's: one pool size for every replica count, never divided per pod.
    let (stream, send, cap) =
        (settings.pools.stream.get(), settings.pools.send.get(), settings.icom.max_in_flight.get());
    assert!(stream + send <= cap && cap <= 6, "pools {stream}+{send} over the cap {cap}");
    assert!(env.keys().all(|k| !k.starts_with("CABINE__POOLS__") && !k.contains("MAX_IN_FLIGHT")));
    assert_eq!(deployment["spec"]["replicas"], 3);
    let rolling = &deployment["spec"]["strategy"]["rollingUpdate"];
    assert_eq!((rolling["maxSurge"].as_u64(), rolling["maxUnavailable"].as_u64()), (Some(1), Some(0)));
    assert_eq!(kind(&objects, "PodDisruptionBudget")["spec"]["maxUnavailable"], 1);

    hardened(spec, container);
    reachable(&objects, &settings);
    no_mount_inside_another(container);
}

/// Volumes mount read-only: a mount point inside another mount could not be created.
fn no_mount_inside_another(container: &Value) {
    let paths: Vec<&str> =
        container["volumeMounts"].as_array().expect("mounts").iter().filter_map(|m| m["mountPath"].as_str()).collect();
    for a in &paths {
        for b in &paths {
            assert!(a == b || !b.starts_with(&format!("{a}/")), "{b} is mounted inside {a}");
        }
    }
}

/// Non-root as the image's user, read-only root, no privilege, no capability.
fn hardened(spec: &Value, container: &Value) {
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(spec["securityContext"]["runAsUser"].as_u64(), Some(IMAGE_UID));
    assert_eq!(spec["automountServiceAccountToken"], false);
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
}

/// Every port of a store or ICOM URL the config names is open in the egress policy.
fn reachable(objects: &[Value], settings: &Settings) {
    let egress = kind(objects, "NetworkPolicy")["spec"]["egress"].as_array().expect("egress rules").clone();
    let open: BTreeSet<u64> = egress
        .iter()
        .flat_map(|r| r["ports"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["port"].as_u64())
        .collect();
    let needed = the_stores_and_icom_ports(settings);
    assert!(needed.is_subset(&open), "egress opens {open:?}, the config needs {needed:?}");
}

/// Every file the config names, checked to come from a Secret volume that lists it;
/// the paths, for [`PodFiles`].
fn secret_files(spec: &Value, container: &Value, files: &[String]) -> Vec<String> {
    let mounts = container["volumeMounts"].as_array().expect("volume mounts");
    let volumes = spec["volumes"].as_array().expect("volumes");
    assert!(!files.is_empty(), "production.toml names no TLS file");
    for file in files {
        let mount = mounts
            .iter()
            .filter(|m| file.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap_or("-"))))
            .max_by_key(|m| m["mountPath"].as_str().map_or(0, str::len))
            .unwrap_or_else(|| panic!("{file}: under no volume mount"));
        let volume = volumes.iter().find(|v| v["name"] == mount["name"]).expect("the mount's volume");
        let inside = &file[mount["mountPath"].as_str().expect("a path").len() + 1..];
        let items = volume["secret"]["items"].as_array().unwrap_or_else(|| panic!("{file}: not from a Secret"));
        assert!(
            items.iter().any(|i| i["path"] == inside),
            "{file}: Secret {} lists no {inside}",
            volume["secret"]["secretName"]
        );
    }
    files.to_vec()
}

#[test]
fn the_ecs_task_definition_is_bound_to_the_config_it_runs() {
    let text = std::fs::read_to_string(root().join("ops/ecs/task-definition.json")).expect("the task definition");
    let task: Value = serde_json::from_str(&text).expect("the task definition is JSON");
    let container = &task["containerDefinitions"][0];
    let mut env: HashMap<String, String> = HashMap::new();
    for e in container["environment"].as_array().expect("environment") {
        env.insert(e["name"].as_str().expect("a name").into(), e["value"].as_str().expect("a value").into());
    }
    for s in container["secrets"].as_array().expect("secrets") {
        let name = s["name"].as_str().expect("a name");
        assert!(s["valueFrom"].as_str().is_some_and(|v| v.starts_with("arn:aws:")), "{name}: not from a secret store");
        env.insert(name.into(), format!("secret-{name}-0123456789abcdef"));
    }
    // On ECS the config directory (production.toml and tls/) is one read-only volume.
    let mount = &container["mountPoints"][0];
    assert_eq!((mount["containerPath"].as_str(), mount["readOnly"].as_bool()), (Some(MOUNT_ROOT), Some(true)));
    let production = std::fs::read_to_string(root().join("config/production.toml")).expect("config/production.toml");
    let files = PodFiles::new(&production, &config_files(&production));
    assert_eq!(env.get("CABINE_CONFIG_DIR").map(String::as_str), Some(CONFIG_DIR));
    let (code, output) = files.check_config(&env);
    assert_eq!(code, Some(0), "check-config refuses the task's environment:\n{output}");
    let settings = files.settings(&env);

    // The drift this file exists for: ECS's stop timeout under the pod's stop budget.
    let stop = seconds(&container["stopTimeout"]);
    assert!(
        stop >= settings.timing.stop_timeout + GRACE_MARGIN && stop <= Duration::from_secs(120),
        "stopTimeout {stop:?}"
    );
    assert_eq!(container["healthCheck"]["command"], serde_json::json!(["CMD", "cabine", "health"]));
    assert_eq!(container["portMappings"][0]["containerPort"].as_u64(), Some(u64::from(settings.http.bind.port())));
    assert_eq!(container["user"].as_str(), Some(format!("{IMAGE_UID}:{IMAGE_UID}").as_str()));
    assert_eq!(container["readonlyRootFilesystem"], true);
    assert_eq!(container["command"], serde_json::json!(["run"]));
    assert!(container["logConfiguration"]["logDriver"].is_string(), "no log configuration");
}
