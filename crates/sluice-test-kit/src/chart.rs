//! The Helm chart as the tests play it: rendered by Helm's engine (`scripts/render_chart.py`),
//! then run under `podman kube play` with the image of the binary under test
//! (`tests/it/chart.rs` and `tests/it/chart_degraded.rs`).
//!
//! What is changed in the rendered objects, and why: the pod runs on the host's network
//! (`hostNetwork: true`; kube play has no Service, and no cluster network to put one on), so
//! its ports are free ones instead of 8080/8081 (`PORT`, `GRPC_PORT` and the container ports
//! named `http`/`grpc` together, `DEBUG_PORT` any) on loopback, one replica (two would share
//! those ports), and the image is the test's. The container ports are resolved from the spec
//! (the Service's `targetPort` names one) but left out of what is played: podman makes port
//! mappings of them, which it refuses on the host's network. Everything else is as rendered:
//! uid 65534, read-only root, the ConfigMap mounted as the config directory, Redis's password
//! from the Secret. What kube play does not do is done by the test, from the rendered spec: it
//! runs each probe's `httpGet` (podman 4.3 runs no readiness or startup probe, and its timers
//! need systemd), and it sends the request to the container port the Service's `targetPort`
//! names.
//!
//! Needs podman (installed by scripts/test.sh) and the chart's virtualenv (made by
//! scripts/check_chart.sh, which scripts/test.sh runs first); fails without them.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::container::*;
use crate::*;

pub const PASSWORD: &str = "chart-test-password";

/// The chart's virtualenv Python: `chart-venv` in [`test_tools`], where scripts/check_chart.sh
/// makes it.
pub fn chart_python() -> PathBuf {
    let python = test_tools().join("chart-venv/bin/python");
    assert!(
        python.exists(),
        "{} missing: scripts/check_chart.sh makes it (scripts/test.sh runs it first)",
        python.display()
    );
    python
}

/// The chart rendered for `release` with `values`, as Helm renders it.
pub fn render(release: &str, values: &Value) -> Vec<Value> {
    let out = Command::new(chart_python())
        .arg(workspace_root().join("scripts/render_chart.py"))
        .args([release, &values.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "render failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn limits(per_minute: u32) -> String {
    format!(
        "domain: chart\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      \
         requests_per_unit: {per_minute}\n"
    )
}

/// The values a user would set for a Redis-backed release with this image and these limits.
pub fn values(redis_port: u16, per_minute: u32) -> Value {
    let image = image();
    let (repository, tag) = image.rsplit_once(':').unwrap();
    json!({
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "backend": "redis",
        "replicaCount": 1,
        "redis": {"url": format!("127.0.0.1:{redis_port}"),
                  "auth": {"enabled": true, "password": PASSWORD}},
        "limits": {"chart.yaml": limits(per_minute)},
    })
}

/// The ports the played pod listens on.
#[derive(Clone, Copy)]
pub struct PodPorts {
    pub http: u16,
    pub grpc: u16,
}

/// The objects kube play runs (ConfigMap, Deployment), with the test's changes (see the module
/// comment); the Service is kept apart for its `targetPort`, the Secret for [`Played::secret`].
pub fn for_kube_play(docs: &[Value], ports: PodPorts) -> (Vec<Value>, Value) {
    let service = docs
        .iter()
        .find(|d| d["kind"] == "Service" && d["spec"]["clusterIP"] != "None")
        .expect("a Service")
        .clone();
    let mut played: Vec<Value> = docs
        .iter()
        .filter(|d| ["ConfigMap", "Deployment"].contains(&d["kind"].as_str().unwrap()))
        .cloned()
        .collect();
    let deployment = played
        .iter_mut()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    let pod = &mut deployment["spec"]["template"]["spec"];
    pod["hostNetwork"] = json!(true);
    let container = &mut pod["containers"][0];
    let port_of = |name: &str| match name {
        "http" => ports.http,
        "grpc" => ports.grpc,
        other => panic!("unexpected port {other}"),
    };
    for port in container["ports"].as_array_mut().unwrap() {
        port["containerPort"] = json!(port_of(port["name"].as_str().unwrap()));
    }
    let env = container["env"].as_array_mut().unwrap();
    for var in env.iter_mut() {
        match var["name"].as_str().unwrap() {
            "PORT" => var["value"] = json!(ports.http.to_string()),
            "GRPC_PORT" => var["value"] = json!(ports.grpc.to_string()),
            _ => {}
        }
    }
    for (name, value) in [
        ("HOST", "127.0.0.1"),
        ("GRPC_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
    ] {
        env.push(json!({"name": name, "value": value}));
    }
    (played, service)
}

/// A played release: the manifest file, and `podman kube down` on it when dropped (its
/// ConfigMaps' volumes and its Secret removed too).
pub struct Played {
    dir: tempfile::TempDir,
    pod: String,
    secrets: std::cell::RefCell<Vec<String>>,
    /// The volumes kube play made of the ConfigMaps.
    volumes: std::cell::RefCell<Vec<String>>,
}

impl Played {
    /// Nothing played yet; the release's pod will be `<release>-pod-0` (kube play's name for a
    /// Deployment's pod).
    pub fn new(release: &str) -> Played {
        Played {
            dir: tempfile::tempdir().unwrap(),
            pod: format!("{release}-pod-0"),
            secrets: Default::default(),
            volumes: Default::default(),
        }
    }

    /// The rendered Secret, made a podman secret by hand: podman 4.3's kube play stores a
    /// Secret object as it is, then reads a `secretKeyRef` from it as a JSON map of key to
    /// base64 value, and fails; a podman secret holding the Secret's `data` is that map.
    pub fn secret(&self, docs: &[Value]) {
        let secret = docs
            .iter()
            .find(|d| d["kind"] == "Secret")
            .expect("a Secret");
        let name = secret["metadata"]["name"].as_str().unwrap();
        let file = self.dir.path().join("secret.json");
        std::fs::write(&file, secret["data"].to_string()).unwrap();
        podman_ok(&["secret", "create", name, file.to_str().unwrap()]);
        self.secrets.borrow_mut().push(name.to_string());
    }

    pub fn file(&self) -> PathBuf {
        self.dir.path().join("release.yaml")
    }

    /// Plays `objects`; when already played, takes the release down first. `kube play
    /// --replace` would keep the ConfigMap's volume as it was (podman 4.3 makes a named
    /// volume of a ConfigMap, fills it when it creates it, and keeps it after the pod is gone),
    /// so the volume is removed with the pod, and the new pod gets the new ConfigMap.
    pub fn play(&self, objects: &[Value]) {
        self.down();
        let yaml: String = objects
            .iter()
            .map(|object| {
                // kube play turns container ports into port mappings, which podman refuses on
                // the host's network; the ports listened on are the environment's anyway.
                let mut object = object.clone();
                if object["kind"] == "Deployment" {
                    object["spec"]["template"]["spec"]["containers"][0]
                        .as_object_mut()
                        .unwrap()
                        .remove("ports");
                }
                if object["kind"] == "ConfigMap" {
                    let name = object["metadata"]["name"].as_str().unwrap().to_string();
                    self.volumes.borrow_mut().push(name);
                }
                format!("---\n{object}\n")
            })
            .collect();
        std::fs::write(self.file(), yaml).unwrap();
        podman_ok(&["kube", "play", self.file().to_str().unwrap()]);
    }

    /// `podman kube down`, and the ConfigMaps' volumes removed.
    pub fn down(&self) {
        if self.file().exists() {
            let _ = podman()
                .args(["kube", "down", self.file().to_str().unwrap()])
                .output();
        }
        for volume in self.volumes.borrow_mut().drain(..) {
            let _ = podman().args(["volume", "rm", "--force", &volume]).output();
        }
    }

    /// The Sluice container of the pod.
    pub fn container(&self) -> String {
        let names = podman_ok(&[
            "ps",
            "--filter",
            &format!("pod={}", self.pod),
            "--format",
            "{{.Names}}",
        ]);
        names
            .lines()
            .find(|n| n.ends_with("-sluice"))
            .unwrap_or_else(|| panic!("no sluice container in pod {}: {names}", self.pod))
            .to_string()
    }

    pub fn logs(&self) -> String {
        Container {
            name: self.container(),
        }
        .logs()
    }
}

impl Drop for Played {
    fn drop(&mut self) {
        self.down();
        for secret in self.secrets.borrow().iter() {
            let _ = podman().args(["secret", "rm", secret]).output();
        }
    }
}

/// The status one probe of the container (`startupProbe`, `readinessProbe`, `livenessProbe`)
/// gets now, sent as the kubelet sends it by the rendered spec; 0 when nothing listens.
pub fn probe_status(deployment: &Value, probe: &str, ports: PodPorts) -> u16 {
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let get = &container[probe]["httpGet"];
    assert_eq!(get["port"], "http", "{probe}: {get}");
    let path = get["path"].as_str().unwrap();
    let addr = ([127, 0, 0, 1], ports.http).into();
    if std::net::TcpStream::connect(addr).is_err() {
        return 0;
    }
    http_request(addr, "GET", path, "").0
}

/// How long the spec lets `probe` fail before the kubelet acts: `periodSeconds` ×
/// `failureThreshold`.
pub fn probe_allowance(deployment: &Value, probe: &str) -> Duration {
    let spec = &deployment["spec"]["template"]["spec"]["containers"][0][probe];
    let period = spec["periodSeconds"].as_u64().unwrap_or(10);
    Duration::from_secs(period * spec["failureThreshold"].as_u64().unwrap_or(3))
}

/// Runs the container's probes as the kubelet would, by the rendered spec: each `httpGet`
/// until it answers 200, within the time the spec allows (and at least 30 s).
pub fn probes_pass(deployment: &Value, ports: PodPorts, played: &Played) {
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let within = probe_allowance(deployment, probe).max(Duration::from_secs(30));
        let ok = holds_within(within, || probe_status(deployment, probe, ports) == 200);
        assert!(ok, "{probe} never answered 200:\n{}", played.logs());
    }
}

/// The container port the Service's gRPC port leads to (its `targetPort`, by name).
pub fn service_target(service: &Value, deployment: &Value) -> u16 {
    let port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "grpc")
        .unwrap();
    let target = port["targetPort"].as_str().unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == target)
        .map(|p| p["containerPort"].as_u64().unwrap() as u16)
        .unwrap()
}
