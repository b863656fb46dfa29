//! Bad input on every route of the control API: the right 4xx with a JSON error, and nothing
//! changes, on disk or in memory.

use crate::common;

use common::daemon::{Daemon, TOKEN, new_key, ports};
use etrelay::proof::fingerprint;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, unique_ip};
use reqwest::Method;
use serde_json::json;

/// Everything a request could have changed.
async fn snapshot(d: &Daemon, keys: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&d.state_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in files {
        let name = f.display().to_string();
        if name.ends_with("-wal") || name.ends_with("-shm") {
            continue; // SQLite's journal: the database's rows below are what counts
        }
        let text = if name.ends_with(".db") {
            ban_rows(&f)
        } else {
            std::fs::read_to_string(&f).unwrap()
        };
        out.push(format!("{name}: {text}"));
    }
    for k in keys {
        for path in ["/server", "/bans"] {
            let (status, mut body) = d.call(Method::GET, path, k, None).await;
            if let Some(p) = body.get_mut("probe") {
                *p = serde_json::Value::Null; // probe times move on by themselves
            }
            out.push(format!("{path} {status} {body}"));
        }
    }
    out
}

/// The rows of a ban store.
fn ban_rows(path: &std::path::Path) -> String {
    let db = rusqlite::Connection::open(path).unwrap();
    let mut stmt = db
        .prepare("SELECT ip, reason, since, expires_at FROM bans ORDER BY ip")
        .unwrap();
    let rows: Vec<String> = stmt
        .query_map([], |r| {
            Ok(format!(
                "{} {} {} {:?}",
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, Option<i64>>(3)?
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows.join("; ")
}

struct Case {
    method: Method,
    path: String,
    auth: Option<String>,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
}

fn case(
    method: Method,
    path: &str,
    auth: Option<&str>,
    body: &[u8],
    status: u16,
    code: &'static str,
) -> Case {
    Case {
        method,
        path: path.into(),
        auth: auth.map(str::to_owned),
        content_type: Some("application/json"),
        body: body.to_vec(),
        status,
        code,
    }
}

#[tokio::test]
async fn every_route_refuses_bad_input_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("state"), &ports(2), &[]).await;
    let (ka, kb) = (new_key(), new_key());
    for (k, port) in [(&ka, 27960), (&kb, 27961)] {
        let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
        et.set_cvar("etrelay_proof", &fingerprint(k));
        assert_eq!(d.register(k, et.addr(), Some(port)).await.0, 201);
        std::mem::forget(et); // keep answering for the whole test
    }
    assert_eq!(
        d.call(
            Method::PUT,
            "/bans/192.0.2.1",
            &ka,
            Some(json!({"reason": "before"}))
        )
        .await
        .0,
        200
    );
    let before = snapshot(&d, &[&ka, &kb]).await;

    let key = ka.as_str();
    let token = Some(TOKEN);
    let huge = format!("{{\"key\": \"{}\"}}", "k".repeat(70 * 1024));
    let good_server = json!({"key": new_key(), "upstream": "127.0.0.1:27960"}).to_string();
    let mut cases = vec![
        // PUT /server (relay token)
        case(Method::PUT, "/server", None, good_server.as_bytes(), 401, "unauthorized"),
        case(Method::PUT, "/server", Some("wrong-token-wrong-token-wrong-token"), good_server.as_bytes(), 401, "unauthorized"),
        case(Method::PUT, "/server", Some(key), good_server.as_bytes(), 401, "unauthorized"),
        case(Method::PUT, "/server", token, b"{not json", 400, "bad_json"),
        case(Method::PUT, "/server", None, b"{not json", 401, "unauthorized"),
        case(Method::PUT, "/bans/192.0.2.9", None, b"{oops", 401, "unauthorized"),
        case(Method::PUT, "/server", token, huge.as_bytes(), 413, "body_too_large"),
        case(Method::PUT, "/server", token, b"", 422, "invalid_body"),
        case(Method::PUT, "/server", token, br#"{"key": 5, "upstream": "127.0.0.1:1"}"#, 422, "invalid_body"),
        case(Method::PUT, "/server", token, br#"{"upstream": "127.0.0.1:1"}"#, 422, "invalid_body"),
        case(Method::PUT, "/server", token, br#"{"key": "0123456789abcdef0123456789abcdef", "upstream": "127.0.0.1:1", "extra": 1}"#, 422, "invalid_body"),
        case(Method::PUT, "/server", token, br#"{"key": "0123456789abcdef0123456789abcdef", "upstream": "127.0.0.1:1", "port": "x"}"#, 422, "invalid_body"),
        case(Method::PUT, "/server", token, br#"{"key": "0123456789abcdef0123456789abcdef", "upstream": "127.0.0.1:1", "port": 70000}"#, 422, "invalid_body"),
        case(Method::PUT, "/server", token, br#"{"key": "short", "upstream": "127.0.0.1:27960"}"#, 422, "key_too_short"),
        case(Method::PUT, "/server", token, br#"{"key": "0123456789abcdef0123456789abcdef", "upstream": "localhost:27960"}"#, 422, "bad_upstream"),
        case(Method::PUT, "/server", token, br#"{"key": "0123456789abcdef0123456789abcdef", "upstream": "127.0.0.1"}"#, 422, "bad_upstream"),
        case(Method::PUT, "/server", token, br#"{"key": "0123456789abcdef0123456789abcdef", "upstream": "0.0.0.0:27960"}"#, 422, "bad_upstream"),
        case(Method::PUT, "/server", token, br#"{"key": "0123456789abcdef0123456789abcdef", "upstream": "127.0.0.1:27960", "port": 1}"#, 422, "port_not_allowed"),
        // GET/DELETE /server, GET /sessions, GET /bans (key)
        case(Method::GET, "/server", None, b"", 401, "unauthorized"),
        case(Method::GET, "/server", token, b"", 401, "unauthorized"),
        case(Method::GET, "/server", Some("0123456789abcdef0123456789abcdef-unknown"), b"", 401, "unauthorized"),
        case(Method::DELETE, "/server", None, b"", 401, "unauthorized"),
        case(Method::DELETE, "/server", Some("not-a-registered-key-000000000000000"), b"", 401, "unauthorized"),
        case(Method::GET, "/sessions", None, b"", 401, "unauthorized"),
        case(Method::GET, "/sessions", token, b"", 401, "unauthorized"),
        case(Method::GET, "/bans", Some("nope"), b"", 401, "unauthorized"),
        // PUT/DELETE /bans/{ip}
        case(Method::PUT, "/bans/192.0.2.9", None, b"", 401, "unauthorized"),
        case(Method::PUT, "/bans/192.0.2.9", token, b"", 401, "unauthorized"),
        case(Method::PUT, "/bans/not-an-ip", Some(key), b"", 400, "bad_ip"),
        case(Method::PUT, "/bans/300.1.2.3", Some(key), b"", 400, "bad_ip"),
        case(Method::PUT, "/bans/192.0.2.9:1234", Some(key), b"", 400, "bad_ip"),
        case(Method::PUT, "/bans/192.0.2.9", Some(key), b"{oops", 400, "bad_json"),
        // Addresses no datagram comes from: nothing to ban.
        case(Method::PUT, "/bans/0.0.0.0", Some(key), b"", 422, "not_a_source"),
        case(Method::PUT, "/bans/::", Some(key), b"", 422, "not_a_source"),
        case(Method::PUT, "/bans/::ffff:0.0.0.0", Some(key), b"", 422, "not_a_source"),
        case(Method::PUT, "/bans/255.255.255.255", Some(key), br#"{"reason": "x"}"#, 422, "not_a_source"),
        case(Method::PUT, "/bans/224.0.0.1", Some(key), b"", 422, "not_a_source"),
        case(Method::PUT, "/bans/ff02::1", Some(key), b"", 422, "not_a_source"),
        case(Method::PUT, "/bans/192.0.2.9", Some(key), br#"{"reason": 5}"#, 422, "invalid_body"),
        case(Method::PUT, "/bans/192.0.2.9", Some(key), br#"{"duration_secs": -1}"#, 422, "invalid_body"),
        case(Method::PUT, "/bans/192.0.2.9", Some(key), br#"{"duration_secs": "1h"}"#, 422, "invalid_body"),
        case(Method::PUT, "/bans/192.0.2.9", Some(key), br#"{"duration_secs": 0}"#, 422, "bad_duration"),
        case(Method::PUT, "/bans/192.0.2.9", Some(key), br#"{"duration_secs": 99999999999}"#, 422, "bad_duration"),
        case(Method::PUT, "/bans/192.0.2.9", Some(key), br#"{"why": "x"}"#, 422, "invalid_body"),
        case(Method::PUT, "/bans/192.0.2.9", Some(key), huge.as_bytes(), 413, "body_too_large"),
        case(Method::DELETE, "/bans/192.0.2.9", Some(key), b"", 404, "not_found"),
        case(Method::DELETE, "/bans/nope", Some(key), b"", 400, "bad_ip"),
        // Another server's key reaches only its own server: B cannot lift A's ban.
        case(Method::DELETE, "/bans/192.0.2.1", Some(kb.as_str()), b"", 404, "not_found"),
        // /metrics
        case(Method::GET, "/metrics", None, b"", 401, "unauthorized"),
        case(Method::GET, "/metrics", Some(key), b"", 401, "unauthorized"),
        // Routes and methods that do not exist.
        case(Method::GET, "/nope", token, b"", 404, "not_found"),
        case(Method::POST, "/server", token, good_server.as_bytes(), 405, "method_not_allowed"),
        case(Method::PATCH, "/bans/192.0.2.1", Some(key), b"", 405, "method_not_allowed"),
    ];
    let mut text_body = case(
        Method::PUT,
        "/server",
        token,
        good_server.as_bytes(),
        415,
        "unsupported_media_type",
    );
    text_body.content_type = Some("text/plain");
    cases.push(text_body);

    for c in &cases {
        let mut req = d.http.request(c.method.clone(), d.url(&c.path));
        if let Some(a) = &c.auth {
            req = req.bearer_auth(a);
        }
        if let Some(ct) = c.content_type
            && !c.body.is_empty()
        {
            req = req.header("content-type", ct);
        }
        let r = req.body(c.body.clone()).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let what = format!("{} {} -> {status} {text}", c.method, c.path);
        assert_eq!(status, c.status, "{what}");
        let body: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {what}"));
        assert_eq!(body["error"], c.code, "{what}");
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}"
        );
    }
    assert_eq!(
        snapshot(&d, &[&ka, &kb]).await,
        before,
        "a refused request changed something"
    );
    d.stop().await;
}
