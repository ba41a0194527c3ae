//! A private PostgreSQL cluster (`initdb` in a temporary directory) on a free
//! loopback port, for the runs that restart Postgres under the pods
//! (`cabine chaos --scenario pg-restart`); the shared one on 5432 is never
//! touched. Trust authentication on loopback, superuser `cabine`, database
//! `postgres`; `fsync=off` (a process crash keeps what the kernel holds — only
//! a machine crash would not, and none is simulated). As root the server runs
//! as the `postgres` user (`runuser`), as anyone else as themselves. Started
//! with [`PostgresServer::start_tls`], it accepts TCP clients only over TLS
//! (`hostssl` lines; a client certificate required when asked). Dropping it
//! stops it (immediate) and removes its directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use super::ServerTls;

#[derive(Debug, thiserror::Error)]
pub enum PostgresServerError {
    #[error("no PostgreSQL server binaries (initdb, pg_ctl) found: {0}")]
    NotInstalled(String),
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    #[error("{what} did not finish within {within:?}")]
    Timeout { what: String, within: Duration },
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// Bound on initdb and on `pg_ctl start` (which itself waits for the server to accept connections).
const COMMAND_WITHIN: Duration = Duration::from_secs(60);
/// Superuser created by initdb; the pods connect as it.
const SUPERUSER: &str = "cabine";

/// A running private PostgreSQL.
pub struct PostgresServer {
    port: u16,
    /// Holds `data/` (the cluster), the socket and `log`.
    dir: PathBuf,
    bin: PathBuf,
    /// Running as root: every server command goes through `runuser -u postgres`.
    as_postgres: bool,
    running: bool,
    /// `ssl=on` and `hostssl` only, when set.
    tls: Option<ServerTls>,
}

impl PostgresServer {
    /// initdb in a fresh temporary directory, then start on a free port.
    pub async fn start() -> Result<PostgresServer, PostgresServerError> {
        PostgresServer::start_with(None).await
    }

    /// Like [`PostgresServer::start`], TCP clients over TLS only, with this certificate;
    /// `tls.verify_clients`: a client certificate chaining to `tls.ca` is required too.
    pub async fn start_tls(tls: &ServerTls) -> Result<PostgresServer, PostgresServerError> {
        PostgresServer::start_with(Some(tls.clone())).await
    }

    async fn start_with(tls: Option<ServerTls>) -> Result<PostgresServer, PostgresServerError> {
        let bin = find_bin()?;
        let dir = std::env::temp_dir().join(super::unique_name("cabine_pg"));
        std::fs::create_dir_all(&dir)?;
        let as_postgres = running_as_root().await;
        let port = super::free_port()?;
        let mut server = PostgresServer { port, dir, bin, as_postgres, running: false, tls };
        if as_postgres {
            server.run("chown", Command::new("chown").arg("postgres").arg(&server.dir)).await?;
        }
        let data = server.data();
        let mut initdb = server.tool("initdb");
        initdb.arg("-D").arg(&data).args(["-A", "trust", "-U", SUPERUSER, "--no-sync", "-E", "UTF8"]);
        server.run("initdb", &mut initdb).await?;
        if let Some(tls) = server.tls.clone() {
            server.install_tls(&tls).await?;
        }
        server.start_again().await?;
        Ok(server)
    }

    /// Copies the certificate, key and CA into the data directory (the key 0600 and
    /// owned by the server's user, as Postgres insists) and allows TCP only over TLS.
    async fn install_tls(&self, tls: &ServerTls) -> Result<(), PostgresServerError> {
        use std::os::unix::fs::PermissionsExt;
        let data = self.data();
        for (from, to) in [(&tls.cert, "server.crt"), (&tls.key, "server.key"), (&tls.ca, "root.crt")] {
            std::fs::copy(from, data.join(to))?;
            std::fs::set_permissions(data.join(to), std::fs::Permissions::from_mode(0o600))?;
        }
        let client = if tls.verify_clients { " clientcert=verify-ca" } else { "" };
        let hba = format!(
            "local all all trust\nhostssl all all 127.0.0.1/32 trust{client}\nhostssl all all ::1/128 trust{client}\n"
        );
        std::fs::write(data.join("pg_hba.conf"), hba)?;
        if self.as_postgres {
            let files = ["server.crt", "server.key", "root.crt", "pg_hba.conf"].map(|f| data.join(f));
            self.run("chown", Command::new("chown").arg("postgres").args(files)).await?;
        }
        Ok(())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://cabine@127.0.0.1:{port}/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops it the way a crash would (`pg_ctl stop -m immediate`: no checkpoint,
    /// every connection cut; the WAL replays at start), leaves it down for `down`,
    /// then starts it again on the same port.
    pub async fn restart_after(&mut self, down: Duration) -> Result<(), PostgresServerError> {
        self.stop_now().await?;
        tokio::time::sleep(down).await;
        self.start_again().await
    }

    async fn start_again(&mut self) -> Result<(), PostgresServerError> {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300",
            self.port,
            self.dir.display()
        );
        if self.tls.is_some() {
            // Relative to the data directory, where install_tls put them.
            options
                .push_str(" -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key -c ssl_ca_file=root.crt");
        }
        let mut start = self.tool("pg_ctl");
        start.arg("-D").arg(self.data()).arg("-o").arg(options).arg("-l").arg(self.dir.join("log"));
        start.args(["-w", "-t", "30", "start"]);
        self.run("pg_ctl start", &mut start).await?;
        self.running = true;
        Ok(())
    }

    async fn stop_now(&mut self) -> Result<(), PostgresServerError> {
        let mut stop = self.tool("pg_ctl");
        stop.arg("-D").arg(self.data()).args(["-m", "immediate", "-w", "-t", "30", "stop"]);
        self.run("pg_ctl stop", &mut stop).await?;
        self.running = false;
        Ok(())
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// A server binary, run as `postgres` when we are root.
    fn tool(&self, name: &str) -> Command {
        let path = self.bin.join(name);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        };
        cmd.stdin(std::process::Stdio::null()).kill_on_drop(true);
        cmd
    }

    async fn run(&self, what: &str, cmd: &mut Command) -> Result<(), PostgresServerError> {
        let output = tokio::time::timeout(COMMAND_WITHIN, cmd.output())
            .await
            .map_err(|_| PostgresServerError::Timeout { what: what.to_owned(), within: COMMAND_WITHIN })??;
        if output.status.success() {
            return Ok(());
        }
        let mut detail = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        if detail.is_empty() {
            detail = format!("{} ({})", output.status, self.log_tail());
        }
        Err(PostgresServerError::Command { what: what.to_owned(), detail })
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(3)..].join(" | ")
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if self.running {
            let pg_ctl = self.bin.join("pg_ctl");
            let mut stop = if self.as_postgres {
                let mut c = std::process::Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(pg_ctl);
                c
            } else {
                std::process::Command::new(pg_ctl)
            };
            let _ = stop.arg("-D").arg(self.data()).args(["-m", "immediate", "-w", "-t", "10", "stop"]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `$CABINE_PG_BIN`, else the newest `/usr/lib/postgresql/*/bin`, else the directory of `initdb` on PATH.
fn find_bin() -> Result<PathBuf, PostgresServerError> {
    if let Ok(dir) = std::env::var("CABINE_PG_BIN") {
        return has_tools(Path::new(&dir)).ok_or(PostgresServerError::NotInstalled(format!("CABINE_PG_BIN={dir}")));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .collect();
    versions.sort();
    if let Some(dir) = versions.into_iter().rev().find_map(|(_, d)| has_tools(&d)) {
        return Ok(dir);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .find_map(|d| has_tools(&d))
        .ok_or_else(|| PostgresServerError::NotInstalled("neither /usr/lib/postgresql/*/bin nor PATH".into()))
}

fn has_tools(dir: &Path) -> Option<PathBuf> {
    (dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()).then(|| dir.to_owned())
}

/// initdb refuses to run as root: then the server runs as `postgres`.
async fn running_as_root() -> bool {
    let id = Command::new("id").arg("-u").output().await;
    id.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
