//! The HTTP client of the relay's control API (docs/etrelay-api.md): plain HTTP/1.1 on the
//! tunnel, JSON in and out, `{"error", "message"}` on failure.

use std::error::Error as StdError;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::error::AdminError;
use super::table::clean;

/// Every request gives up after this long. Registration waits for the relay's proof check
/// (3 `getstatus` attempts, up to about 9 s).
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The base URL of the relay's control API, e.g. `http://10.8.0.1:8080`. A bare `host:port`
/// means `http://host:port`; only plain `http` is spoken (the API is on the tunnel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlUrl {
    /// Without a trailing `/`; route paths are appended to it.
    base: String,
}

impl FromStr for ControlUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err("the control URL is empty".into());
        }
        let full = if s.contains("://") {
            s.to_owned()
        } else {
            format!("http://{s}")
        };
        let url = reqwest::Url::parse(&full).map_err(|e| format!("not a URL ({e}): {s}"))?;
        if url.scheme() != "http" {
            return Err(format!(
                "only http:// is supported (the control API is plain HTTP on the tunnel): {s}"
            ));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(format!("no host in the control URL: {s}"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "the control URL cannot have a query or fragment: {s}"
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "the control URL cannot carry credentials (the key or token is sent as a bearer): {s}"
            ));
        }
        Ok(Self {
            base: url.as_str().trim_end_matches('/').to_owned(),
        })
    }
}

impl fmt::Display for ControlUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.base)
    }
}

impl ControlUrl {
    fn endpoint(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Which call failed: the same error code means different things to the user.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Route {
    /// `PUT /server`, with the relay token.
    Register { port: Option<u16> },
    /// `GET /server`, `DELETE /server`, `GET /sessions`, `GET /bans`, with the key.
    Key,
    /// `PUT /bans/{ip}`.
    Ban { ip: IpAddr },
    /// `DELETE /bans/{ip}`.
    Unban { ip: IpAddr },
}

/// A successful answer.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    /// `None` for an empty body (204).
    pub(crate) body: Option<Value>,
}

/// Makes ring the process's TLS provider unless one is set: the workspace builds reqwest
/// without a default provider (blindrelay picks its own), and a client cannot be built
/// without one, even for plain-HTTP URLs.
pub(crate) fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[derive(Debug)]
pub(crate) struct Client {
    http: reqwest::Client,
    base: ControlUrl,
}

impl Client {
    pub(crate) fn new(base: &ControlUrl) -> Result<Self, AdminError> {
        install_tls_provider();
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            // The control API is on the tunnel: never through a proxy of the environment.
            .no_proxy()
            // The bearer secret goes to the URL given, nowhere else.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("etrelay-admin/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| AdminError::Http {
                url: base.to_string(),
                reason: chain(&e),
            })?;
        Ok(Self {
            http,
            base: base.clone(),
        })
    }

    /// Sends one request with `Authorization: Bearer <bearer>`, and a JSON body if any.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        bearer: &str,
        body: Option<&Value>,
        route: Route,
    ) -> Result<Reply, AdminError> {
        let mut request = self
            .http
            .request(method, self.base.endpoint(path))
            .bearer_auth(bearer)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| self.transport(&e))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| self.transport(&e))?;
        if !status.is_success() {
            return Err(api_error(route, status, &bytes, &self.base));
        }
        let body = if bytes.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            Some(
                serde_json::from_slice(&bytes).map_err(|e| AdminError::BadResponse {
                    url: self.base.to_string(),
                    reason: format!("HTTP {status} with a body that is not JSON ({e})"),
                })?,
            )
        };
        Ok(Reply { status, body })
    }

    fn transport(&self, e: &reqwest::Error) -> AdminError {
        let url = self.base.to_string();
        if e.is_timeout() {
            AdminError::Timeout {
                url,
                secs: REQUEST_TIMEOUT.as_secs(),
            }
        } else if e.is_connect() {
            AdminError::Unreachable {
                url,
                reason: innermost(e),
            }
        } else {
            AdminError::Http {
                url,
                reason: chain(e),
            }
        }
    }
}

/// The error an error answer stands for, with a message for the user.
pub(crate) fn api_error(
    route: Route,
    status: StatusCode,
    body: &[u8],
    base: &ControlUrl,
) -> AdminError {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        error: String,
        #[serde(default)]
        message: String,
    }
    let Ok(parsed) = serde_json::from_slice::<ErrorBody>(body) else {
        return AdminError::Api {
            status: status.as_u16(),
            code: String::new(),
            message: String::new(),
            text: format!(
                "the control API at {base} answered HTTP {status} without an etrelay error: is --control the relay's control address?"
            ),
        };
    };
    let code = clean(&parsed.error);
    let message = clean(&parsed.message);
    let text = describe(route, status, &code, &message, base);
    AdminError::Api {
        status: status.as_u16(),
        code,
        message,
        text,
    }
}

fn describe(
    route: Route,
    status: StatusCode,
    code: &str,
    message: &str,
    base: &ControlUrl,
) -> String {
    let relay_said = if message.is_empty() {
        String::new()
    } else {
        format!(" (relay: {message})")
    };
    match (code, route) {
        ("unauthorized", Route::Register { .. }) => {
            "the relay refused the relay token: check --token-file".into()
        }
        ("unauthorized", _) => "the relay does not know this key (not registered, left, taken over by another key, or the relay lost its state): run `etrelay admin register` again".into(),
        ("proof_failed", _) => format!(
            "the relay could not see the proof on the game server: check that --rcon reaches the server and that --upstream is the address the relay reaches it at{relay_said}"
        ),
        ("port_taken", Route::Register { port: Some(port) }) => format!(
            "port {port} is held by another server on the relay: pick another --port, or leave --port out to get a free one"
        ),
        ("port_taken", _) => format!("the port is held by another server on the relay{relay_said}"),
        ("key_in_use", _) => format!(
            "this key already owns another server on the relay (one key per server): give this server its own --key-file{relay_said}"
        ),
        ("no_free_port", _) => "every port of the relay's --ports is taken: ask the relay's admin for more ports".into(),
        ("port_not_allowed", Route::Register { port: Some(port) }) => format!(
            "port {port} is not one of the relay's --ports: pick one of them, or leave --port out to get a free one"
        ),
        ("port_not_allowed", _) => format!("the port is not one of the relay's --ports{relay_said}"),
        ("bad_upstream", _) => format!("the relay refused --upstream: it must be a literal ip:port{relay_said}"),
        ("key_too_short", _) => "the relay refused the key as too short (at least 32 characters): delete the key file and register again".into(),
        ("bad_ip", Route::Ban { ip } | Route::Unban { ip }) => {
            format!("the relay refused {ip} as an IP address{relay_said}")
        }
        ("not_a_source", Route::Ban { ip }) => format!(
            "{ip} cannot be banned: no datagram comes from an unspecified, multicast or broadcast address; give the player's address{relay_said}"
        ),
        ("bad_duration", _) => format!("the relay refused the ban duration (0, or too long){relay_said}"),
        ("not_found", Route::Unban { ip }) => format!("{ip} is not banned"),
        ("not_found" | "method_not_allowed", _) => format!(
            "the control API at {base} has no such route ({code}): is --control the relay's control address, and is the relay as recent as this tool?"
        ),
        ("body_too_large", _) => format!("the request is too large for the relay (over 64 KiB: a reason that long?){relay_said}"),
        ("bad_json" | "unsupported_media_type" | "invalid_body", _) => format!(
            "the relay did not understand the request ({code}): is the relay as recent as this tool?{relay_said}"
        ),
        ("bind_failed", _) => format!("the relay could not bind the public port{relay_said}"),
        ("state_write_failed", _) => {
            format!("the relay could not save its state, nothing changed: try again later{relay_said}")
        }
        _ => format!("the control API answered HTTP {status}, {code}{relay_said}"),
    }
}

/// The deepest cause, which names what went wrong (`Connection refused (os error 111)`).
fn innermost(e: &(dyn StdError + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    clean(&cause.to_string())
}

/// The whole chain of causes, `: `-joined.
fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cause = e;
    while let Some(next) = cause.source() {
        let text = next.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        cause = next;
    }
    clean(&parts.join(": "))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::SocketAddr;

    use serde_json::json;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;
    use tokio::task::JoinHandle;

    use super::*;

    /// What the test server got.
    #[derive(Debug, Clone)]
    pub(crate) struct Request {
        pub(crate) method: String,
        pub(crate) path: String,
        pub(crate) headers: Vec<(String, String)>,
        pub(crate) body: Vec<u8>,
    }

    impl Request {
        pub(crate) fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }

        pub(crate) fn json(&self) -> Value {
            serde_json::from_slice(&self.body).unwrap()
        }
    }

    /// A canned HTTP/1.1 response.
    pub(crate) fn response(status: &str, body: &str) -> String {
        let content_type = if body.is_empty() {
            String::new()
        } else {
            "Content-Type: application/json\r\n".to_owned()
        };
        format!(
            "HTTP/1.1 {status}\r\n{content_type}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    /// A one-request HTTP server on 127.0.0.1: reads one request, writes `reply`, returns the
    /// request.
    pub(crate) async fn one_shot(reply: String) -> (ControlUrl, JoinHandle<Request>) {
        one_shot_with(reply, || {}).await
    }

    /// [`one_shot`], calling `on_request` once the request is in, before answering.
    pub(crate) async fn one_shot_with(
        reply: String,
        on_request: impl FnOnce() + Send + 'static,
    ) -> (ControlUrl, JoinHandle<Request>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let request = read_request(&mut stream).await;
            on_request();
            stream.write_all(reply.as_bytes()).await.unwrap();
            stream.shutdown().await.unwrap();
            request
        });
        (format!("http://{addr}").parse().unwrap(), task)
    }

    async fn read_request(stream: &mut tokio::net::TcpStream) -> Request {
        let mut data = Vec::new();
        let mut buf = [0u8; 4096];
        let header_end = loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed before the end of the headers");
            data.extend_from_slice(&buf[..n]);
            if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8(data[..header_end].to_vec()).unwrap();
        let mut lines = head.split("\r\n");
        let mut start = lines.next().unwrap().split(' ');
        let method = start.next().unwrap().to_owned();
        let path = start.next().unwrap().to_owned();
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once(':').unwrap();
                (k.trim().to_owned(), v.trim().to_owned())
            })
            .collect();
        let length: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map_or(0, |(_, v)| v.parse().unwrap());
        let mut body = data[header_end..].to_vec();
        while body.len() < length {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed before the end of the body");
            body.extend_from_slice(&buf[..n]);
        }
        Request {
            method,
            path,
            headers,
            body,
        }
    }

    #[test]
    fn control_urls() {
        let url: ControlUrl = "10.8.0.1:8080".parse().unwrap();
        assert_eq!(url.to_string(), "http://10.8.0.1:8080");
        let url: ControlUrl = "http://10.8.0.1:8080/".parse().unwrap();
        assert_eq!(url.endpoint("/server"), "http://10.8.0.1:8080/server");
        let url: ControlUrl = "http://front/etrelay/".parse().unwrap();
        assert_eq!(
            url.endpoint("/bans/1.2.3.4"),
            "http://front/etrelay/bans/1.2.3.4"
        );
        assert!("https://10.8.0.1:8080".parse::<ControlUrl>().is_err());
        assert!("".parse::<ControlUrl>().is_err());
        assert!("http://a:b@host:1".parse::<ControlUrl>().is_err());
        assert!("http://host:1/?x=1".parse::<ControlUrl>().is_err());
    }

    #[tokio::test]
    async fn sends_method_path_bearer_and_body() {
        let (url, server) = one_shot(response("200 OK", r#"{"ip":"203.0.113.7"}"#)).await;
        let client = Client::new(&url).unwrap();
        let body = json!({"reason": "aimbot", "duration_secs": 3600});
        let ip: IpAddr = "203.0.113.7".parse().unwrap();
        let reply = client
            .call(
                Method::PUT,
                "/bans/203.0.113.7",
                "k".repeat(40).as_str(),
                Some(&body),
                Route::Ban { ip },
            )
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, Some(json!({"ip": "203.0.113.7"})));
        let request = server.await.unwrap();
        assert_eq!(request.method, "PUT");
        assert_eq!(request.path, "/bans/203.0.113.7");
        assert_eq!(
            request.header("authorization"),
            Some(format!("Bearer {}", "k".repeat(40)).as_str())
        );
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert_eq!(request.json(), body);
    }

    #[tokio::test]
    async fn empty_answer_has_no_body() {
        let (url, server) = one_shot(response("204 No Content", "")).await;
        let client = Client::new(&url).unwrap();
        let reply = client
            .call(Method::DELETE, "/server", "key", None, Route::Key)
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::NO_CONTENT);
        assert_eq!(reply.body, None);
        let request = server.await.unwrap();
        assert_eq!(request.method, "DELETE");
        assert_eq!(request.path, "/server");
        assert!(request.body.is_empty());
    }

    async fn error_for(status: &str, body: &str, route: Route) -> AdminError {
        let (url, server) = one_shot(response(status, body)).await;
        let client = Client::new(&url).unwrap();
        let err = client
            .call(Method::GET, "/server", "key", None, route)
            .await
            .unwrap_err();
        server.await.unwrap();
        err
    }

    #[tokio::test]
    async fn error_bodies_become_messages() {
        let err = error_for(
            "401 Unauthorized",
            r#"{"error":"unauthorized","message":"bad token"}"#,
            Route::Register { port: None },
        )
        .await;
        assert_eq!(
            err.to_string(),
            "the relay refused the relay token: check --token-file"
        );
        assert!(
            matches!(&err, AdminError::Api { status: 401, code, .. } if code == "unauthorized")
        );

        let err = error_for(
            "401 Unauthorized",
            r#"{"error":"unauthorized","message":"unknown key"}"#,
            Route::Key,
        )
        .await;
        assert!(
            err.to_string()
                .starts_with("the relay does not know this key"),
            "{err}"
        );
        assert!(err.to_string().contains("etrelay admin register"), "{err}");

        let err = error_for(
            "403 Forbidden",
            r#"{"error":"proof_failed","message":"etrelay_proof is missing"}"#,
            Route::Register { port: None },
        )
        .await;
        assert_eq!(
            err.to_string(),
            "the relay could not see the proof on the game server: check that --rcon reaches the server and that --upstream is the address the relay reaches it at (relay: etrelay_proof is missing)"
        );

        let err = error_for(
            "409 Conflict",
            r#"{"error":"port_taken","message":"port 27960 is taken"}"#,
            Route::Register { port: Some(27960) },
        )
        .await;
        assert!(
            err.to_string()
                .starts_with("port 27960 is held by another server"),
            "{err}"
        );

        let err = error_for(
            "503 Service Unavailable",
            r#"{"error":"no_free_port","message":"x"}"#,
            Route::Register { port: None },
        )
        .await;
        assert!(
            err.to_string()
                .starts_with("every port of the relay's --ports is taken"),
            "{err}"
        );

        let err = error_for(
            "422 Unprocessable Entity",
            r#"{"error":"port_not_allowed","message":"x"}"#,
            Route::Register { port: Some(1) },
        )
        .await;
        assert!(
            err.to_string()
                .starts_with("port 1 is not one of the relay's --ports"),
            "{err}"
        );

        let ip: IpAddr = "2001:db8::1".parse().unwrap();
        let err = error_for(
            "404 Not Found",
            r#"{"error":"not_found","message":"no such ban"}"#,
            Route::Unban { ip },
        )
        .await;
        assert_eq!(err.to_string(), "2001:db8::1 is not banned");

        // A code this tool does not know yet still reads well.
        let err = error_for(
            "418 I'm a teapot",
            r#"{"error":"teapot","message":"short\nand stout"}"#,
            Route::Key,
        )
        .await;
        assert_eq!(
            err.to_string(),
            r"the control API answered HTTP 418 I'm a teapot, teapot (relay: short\nand stout)"
        );

        // Not etrelay at all.
        let err = error_for("502 Bad Gateway", "<html>nope</html>", Route::Key).await;
        assert!(
            err.to_string().contains("without an etrelay error"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn unreachable_control_api() {
        // Bind then drop a listener: its port is (almost certainly) closed for the test.
        let addr: SocketAddr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let url: ControlUrl = format!("http://{addr}").parse().unwrap();
        let client = Client::new(&url).unwrap();
        let err = client
            .call(Method::GET, "/server", "key", None, Route::Key)
            .await
            .unwrap_err();
        assert!(matches!(err, AdminError::Unreachable { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("cannot reach the control API at http://{addr}: ")),
            "{text}"
        );
        assert!(text.to_lowercase().contains("refused"), "{text}");
    }

    #[tokio::test]
    async fn success_that_is_not_json() {
        let (url, server) = one_shot(response("200 OK", "hello")).await;
        let client = Client::new(&url).unwrap();
        let err = client
            .call(Method::GET, "/server", "key", None, Route::Key)
            .await
            .unwrap_err();
        server.await.unwrap();
        assert!(matches!(err, AdminError::BadResponse { .. }), "{err:?}");
    }
}
