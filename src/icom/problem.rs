//! RFC 7807 problem details in their XML form, as ICOM writes them on a 4xx:
//! `<problem xmlns="urn:ietf:rfc:7807"><type>…</type><title>…</title>…</problem>`.

use quick_xml::Reader;
use quick_xml::escape::{escape, resolve_predefined_entity};
use quick_xml::events::Event;

/// The namespace of RFC 7807 XML problems.
pub const NAMESPACE: &str = "urn:ietf:rfc:7807";

/// One problem; every member is optional in RFC 7807.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Problem {
    /// `type`: a URI such as `…/error/invalidHeader`.
    pub kind: Option<String>,
    pub title: Option<String>,
    pub status: Option<u16>,
    pub detail: Option<String>,
    pub instance: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProblemError {
    #[error("problem body is not UTF-8")]
    NotUtf8,
    #[error("problem body is not XML: {0}")]
    Xml(String),
    #[error("root element is not <problem>")]
    NotAProblem,
}

impl Problem {
    /// Parses a problem body (members other than the five standard ones are ignored).
    pub fn parse(body: &[u8]) -> Result<Problem, ProblemError> {
        let text = std::str::from_utf8(body).map_err(|_| ProblemError::NotUtf8)?;
        let mut reader = Reader::from_str(text);
        let mut problem = Problem::default();
        let mut depth = 0usize;
        let mut root = false;
        let mut member: Option<(String, String)> = None;
        loop {
            match reader.read_event().map_err(|e| ProblemError::Xml(e.to_string()))? {
                Event::Start(s) => {
                    let name = s.local_name().as_ref().to_owned();
                    if depth == 0 {
                        if root || name != "problem" {
                            return Err(ProblemError::NotAProblem);
                        }
                        root = true;
                    }
                    member = (depth == 1).then(|| (name, String::new()));
                    depth += 1;
                }
                Event::Empty(s) if depth == 0 => {
                    return if s.local_name().as_ref() == "problem" {
                        Ok(problem)
                    } else {
                        Err(ProblemError::NotAProblem)
                    };
                }
                Event::Text(t) => push(&mut member, &t.xml10_content()),
                Event::CData(c) => push(&mut member, &c.xml10_content()),
                Event::GeneralRef(r) => {
                    let c = r.resolve_char_ref().ok().flatten().map(String::from);
                    push(&mut member, c.as_deref().or_else(|| resolve_predefined_entity(&r)).unwrap_or(""));
                }
                Event::End(_) => {
                    depth = depth.saturating_sub(1);
                    if let Some((name, value)) = member.take() {
                        problem.set(&name, value.trim());
                    }
                }
                Event::Eof if depth > 0 => return Err(ProblemError::Xml("unexpected end".into())),
                Event::Eof => return if root { Ok(problem) } else { Err(ProblemError::NotAProblem) },
                _ => {}
            }
        }
    }

    fn set(&mut self, name: &str, value: &str) {
        let value = value.to_owned();
        match name {
            "type" => self.kind = Some(value),
            "title" => self.title = Some(value),
            "status" => self.status = value.parse().ok(),
            "detail" => self.detail = Some(value),
            "instance" => self.instance = Some(value),
            _ => {}
        }
    }

    /// Writes the problem as `application/problem+xml`.
    pub fn to_xml(&self) -> String {
        let mut xml = format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<problem xmlns=\"{NAMESPACE}\">");
        let status = self.status.map(|s| s.to_string());
        let members = [
            ("type", self.kind.as_deref()),
            ("title", self.title.as_deref()),
            ("status", status.as_deref()),
            ("detail", self.detail.as_deref()),
            ("instance", self.instance.as_deref()),
        ];
        for (name, value) in members {
            if let Some(value) = value {
                xml.push_str(&format!("<{name}>{}</{name}>", escape(value)));
            }
        }
        xml.push_str("</problem>\n");
        xml
    }

    /// `type: title (detail)` for logs and outcome texts.
    pub fn summary(&self) -> String {
        let mut s = self.kind.clone().unwrap_or_else(|| "about:blank".into());
        if let Some(title) = &self.title {
            s.push_str(&format!(": {title}"));
        }
        if let Some(detail) = &self.detail {
            s.push_str(&format!(" ({detail})"));
        }
        s
    }
}

fn push(member: &mut Option<(String, String)>, text: &str) {
    if let Some((_, value)) = member {
        value.push_str(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_escaping() {
        let p = Problem {
            kind: Some("https://icom.pi.rsfn.net.br/error/invalidHeader".into()),
            title: Some("Header <traceparent> & co not allowed".into()),
            status: Some(400),
            detail: Some("only whitelisted headers".into()),
            instance: None,
        };
        assert_eq!(Problem::parse(p.to_xml().as_bytes()).unwrap(), p);
    }

    #[test]
    fn reads_a_central_bank_style_body() {
        let body = br#"<problem xmlns="urn:ietf:rfc:7807"><type>https://x/error/invalidHeader</type><title>Invalid header</title><status>400</status></problem>"#;
        let p = Problem::parse(body).unwrap();
        assert_eq!(p.kind.as_deref(), Some("https://x/error/invalidHeader"));
        assert_eq!(p.status, Some(400));
        assert_eq!(p.summary(), "https://x/error/invalidHeader: Invalid header");
    }

    #[test]
    fn other_bodies_are_not_problems() {
        assert_eq!(Problem::parse(b"<html><body>502</body></html>"), Err(ProblemError::NotAProblem));
        assert!(matches!(Problem::parse(b"<problem><type>x</typ></problem>"), Err(ProblemError::Xml(_))));
        assert_eq!(Problem::parse(&[0xff, 0xfe]), Err(ProblemError::NotUtf8));
        assert_eq!(Problem::parse(b""), Err(ProblemError::NotAProblem));
    }
}
