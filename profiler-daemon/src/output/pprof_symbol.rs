//! `/debug/pprof/symbol`, answered as Go's net/http/pprof answers it:
//! `num_symbols: 1`, then the names of the addresses a request posts. A
//! node-wide daemon's addresses belong to a process, which the request
//! names (`?pid=P`); pprof's own request drops the query and gets no
//! names (the profiles come named).

use bytes::Bytes;
use hyper::{Method, Request, StatusCode};

use crate::output::pprof_http::{Reply, refuse, reply};

/// Addresses one `/debug/pprof/symbol` request may name.
pub const MAX_SYMBOL_ADDRESSES: usize = 4096;
/// Bytes of its body: that many addresses of 16 hex digits, `0x` and `+`.
const MAX_SYMBOL_BODY: usize = MAX_SYMBOL_ADDRESSES * 19;

/// `/debug/pprof/symbol`, answered as Go's handler answers it:
/// `num_symbols: 1`, then `0xADDR name` for each address of the body
/// (addresses in hex, `+` between them) that names a function. A
/// node-wide daemon's addresses belong to a process, named by `pid`
/// (`POST /debug/pprof/symbol?pid=P`); without one (pprof's own request,
/// which drops the query) no address is named, as Go names none it does
/// not know: the profiles come named.
pub async fn symbol(req: Request<hyper::body::Incoming>) -> Reply {
    use http_body_util::BodyExt as _;
    let method = req.method().clone();
    if method != Method::GET && method != Method::POST {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "use GET or POST");
    }
    let mut pid = None;
    for (key, value) in form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()) {
        match (&*key, value.trim().parse::<u32>()) {
            ("pid", Ok(p)) if p > 0 => pid = Some(p),
            ("pid", _) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    &format!("pid: expected a process id, got {value:?}"),
                );
            }
            (other, _) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    &format!("unknown parameter {other:?}"),
                );
            }
        }
    }
    let body = if method == Method::POST {
        match http_body_util::Limited::new(req.into_body(), MAX_SYMBOL_BODY)
            .collect()
            .await
        {
            Ok(body) => body.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("at most {MAX_SYMBOL_ADDRESSES} addresses a request"),
                );
            }
            Err(e) => return refuse(StatusCode::BAD_REQUEST, &format!("reading the body: {e}")),
        }
    } else {
        Bytes::new()
    };
    let addrs = match parse_addresses(&body) {
        Ok(addrs) => addrs,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, &why),
    };
    let mut text = String::from("num_symbols: 1\n");
    if let (Some(pid), false) = (pid, addrs.is_empty()) {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return refuse(StatusCode::NOT_FOUND, &format!("no process {pid}"));
        }
        let lookup = addrs.clone();
        let names = tokio::task::spawn_blocking(move || {
            crate::stacks::symbolize::lookup::name_addresses(pid, &lookup)
        })
        .await;
        match names {
            Ok(Ok(names)) => {
                for (addr, name) in addrs.iter().zip(names) {
                    if let Some(name) = name {
                        text.push_str(&format!("{addr:#x} {name}\n"));
                    }
                }
            }
            Ok(Err(why)) => return refuse(StatusCode::NOT_FOUND, &why),
            Err(_) => {
                return refuse(StatusCode::INTERNAL_SERVER_ERROR, "the look-up failed");
            }
        }
    }
    reply(StatusCode::OK, "text/plain; charset=utf-8", text)
}

/// `0xADDR+0xADDR...` as pprof posts it (Go reads each word with
/// `strconv.ParseUint(word, 0, 64)`: `0x` hex or decimal); blanks allowed.
fn parse_addresses(body: &[u8]) -> Result<Vec<u64>, String> {
    let text = std::str::from_utf8(body).map_err(|_| "the body is not text".to_string())?;
    let mut addrs = Vec::new();
    for word in text.split(|c: char| c == '+' || c.is_ascii_whitespace()) {
        if word.is_empty() {
            continue;
        }
        let parsed = match word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => word.parse(),
        };
        let addr = parsed.map_err(|_| {
            format!(
                "not an address: {:?}",
                word.chars().take(40).collect::<String>()
            )
        })?;
        if addrs.len() == MAX_SYMBOL_ADDRESSES {
            return Err(format!(
                "at most {MAX_SYMBOL_ADDRESSES} addresses a request"
            ));
        }
        addrs.push(addr);
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses as pprof posts them (`0xADDR+0xADDR`), bounded, and a
    /// one-line reason for anything else.
    #[test]
    fn symbol_addresses_parsed_as_go_parses_them() {
        assert_eq!(
            parse_addresses(b"0x401000+0x7f00aa\n+4096").unwrap(),
            vec![0x401000, 0x7f00aa, 4096]
        );
        assert_eq!(parse_addresses(b"").unwrap(), Vec::<u64>::new());
        assert!(
            parse_addresses(b"0xzz")
                .unwrap_err()
                .contains("not an address")
        );
        assert!(parse_addresses(&[0xff, 0xfe]).is_err());
        let many = vec!["0x1"; MAX_SYMBOL_ADDRESSES + 1].join("+");
        assert!(
            parse_addresses(many.as_bytes())
                .unwrap_err()
                .contains("at most")
        );
    }
}
