//! Reading the DICT's XML (spec 1.8.0): a `GetEntryResponse` into an
//! [`Entry`], `ListPoliciesResponse` / `GetPolicyResponse` into bucket
//! states, a problem's `type`. Elements are read by their path, so the
//! `Signature` and `Statistics` the client does not use pass by.

use std::collections::HashMap;

use quick_xml::Reader;
use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::Event;
use serde::{Deserialize, Serialize};

/// A DICT entry, as cabine hands it to the bank core.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub key: String,
    pub key_type: String,
    pub account: Account,
    pub owner: Owner,
    pub creation_date: String,
    pub key_ownership_date: String,
    /// Set while a claim (portability or ownership) is open: the owner may change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_claim_creation_date: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Account {
    pub participant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    pub account_number: String,
    pub account_type: String,
    pub opening_date: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Owner {
    #[serde(rename = "type")]
    pub kind: String,
    pub tax_id_number: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trade_name: Option<String>,
}

/// One bucket as `GET /policies/` reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyState {
    pub name: String,
    pub available: u64,
    pub capacity: u64,
    pub refill_tokens: u64,
    pub refill_period_sec: u64,
}

/// The participant's category and its buckets.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Policies {
    pub category: String,
    pub policies: Vec<PolicyState>,
}

#[derive(Debug, thiserror::Error)]
pub enum XmlError {
    #[error("malformed XML: {0}")]
    Malformed(String),
    #[error("missing element {0}")]
    Missing(String),
    #[error("element {0}: not a number")]
    NotANumber(String),
}

/// Every leaf's text by its path (`Entry/Account/Participant`, root excluded); each
/// `Policy` element closes a record of its own.
struct Leaves {
    text: HashMap<String, String>,
    policies: Vec<HashMap<String, String>>,
}

fn leaves(xml: &str) -> Result<Leaves, XmlError> {
    let mut reader = Reader::from_str(xml);
    let (mut path, mut text, mut out) = (Vec::<String>::new(), String::new(), HashMap::new());
    let (mut policy, mut policies) = (HashMap::new(), Vec::new());
    loop {
        match reader.read_event().map_err(|e| XmlError::Malformed(e.to_string()))? {
            Event::Start(e) => {
                path.push(String::from_utf8_lossy(e.local_name().as_ref().as_bytes()).into_owned());
                text.clear();
            }
            Event::Text(t) => text.push_str(&t.xml10_content()),
            Event::GeneralRef(r) => match r.resolve_char_ref() {
                Ok(Some(c)) => text.push(c),
                _ => text.push_str(
                    resolve_predefined_entity(&r)
                        .ok_or_else(|| XmlError::Malformed(format!("unknown entity &{};", &*r)))?,
                ),
            },
            Event::End(_) => {
                let name = path.pop().unwrap_or_default();
                if name == "Policy" {
                    policies.push(std::mem::take(&mut policy));
                } else if path.last().is_some_and(|p| p == "Policy") {
                    policy.insert(name, text.trim().to_owned());
                } else if !path.is_empty() {
                    out.insert(
                        format!("{}/{name}", path[1..].join("/")).trim_start_matches('/').to_owned(),
                        text.trim().to_owned(),
                    );
                }
                text.clear();
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !path.is_empty() {
        return Err(XmlError::Malformed("unclosed elements".into()));
    }
    Ok(Leaves { text: out, policies })
}

impl Leaves {
    fn get(&self, path: &str) -> Result<String, XmlError> {
        self.text.get(path).filter(|v| !v.is_empty()).cloned().ok_or_else(|| XmlError::Missing(path.into()))
    }

    fn opt(&self, path: &str) -> Option<String> {
        self.text.get(path).filter(|v| !v.is_empty()).cloned()
    }
}

/// A `GetEntryResponse`.
pub fn entry(xml: &str) -> Result<Entry, XmlError> {
    let l = leaves(xml)?;
    Ok(Entry {
        key: l.get("Entry/Key")?,
        key_type: l.get("Entry/KeyType")?,
        account: Account {
            participant: l.get("Entry/Account/Participant")?,
            branch: l.opt("Entry/Account/Branch"),
            account_number: l.get("Entry/Account/AccountNumber")?,
            account_type: l.get("Entry/Account/AccountType")?,
            opening_date: l.get("Entry/Account/OpeningDate")?,
        },
        owner: Owner {
            kind: l.get("Entry/Owner/Type")?,
            tax_id_number: l.get("Entry/Owner/TaxIdNumber")?,
            name: l.get("Entry/Owner/Name")?,
            trade_name: l.opt("Entry/Owner/TradeName"),
        },
        creation_date: l.get("Entry/CreationDate")?,
        key_ownership_date: l.get("Entry/KeyOwnershipDate")?,
        open_claim_creation_date: l.opt("Entry/OpenClaimCreationDate"),
    })
}

/// A `ListPoliciesResponse` or a `GetPolicyResponse`.
pub fn policies(xml: &str) -> Result<Policies, XmlError> {
    let l = leaves(xml)?;
    let number = |p: &HashMap<String, String>, k: &str| -> Result<u64, XmlError> {
        let v = p.get(k).ok_or_else(|| XmlError::Missing(format!("Policy/{k}")))?;
        v.parse().map_err(|_| XmlError::NotANumber(format!("Policy/{k}")))
    };
    let mut policies = Vec::new();
    for p in &l.policies {
        policies.push(PolicyState {
            name: p.get("Name").cloned().ok_or_else(|| XmlError::Missing("Policy/Name".into()))?,
            available: number(p, "AvailableTokens")?,
            capacity: number(p, "Capacity")?,
            refill_tokens: number(p, "RefillTokens")?,
            refill_period_sec: number(p, "RefillPeriodSec")?,
        });
    }
    Ok(Policies { category: l.get("Category")?, policies })
}

/// A problem document's `type` suffix (`…/error/RateLimited` → `RateLimited`), if it is one.
pub fn problem_type(xml: &str) -> Option<String> {
    let l = leaves(xml).ok()?;
    l.opt("type").map(|t| t.rsplit('/').next().unwrap_or_default().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's example (`GetEntryResponseInitiator.xml`, 1.8.0), trimmed of counters.
    const SPEC_ENTRY: &str = r#"<GetEntryResponse><Signature></Signature><ResponseTime>2020-01-10T10:00:00.000Z</ResponseTime>
        <CorrelationId>a9f13566e19f5ca51329479a5bae60c5</CorrelationId><Entry><Key>11122233300</Key><KeyType>CPF</KeyType>
        <Account><Participant>12345678</Participant><Branch>0001</Branch><AccountNumber>0007654321</AccountNumber>
        <AccountType>CACC</AccountType><OpeningDate>2010-01-10T03:00:00.000Z</OpeningDate></Account>
        <Owner><Type>NATURAL_PERSON</Type><TaxIdNumber>11122233300</TaxIdNumber><Name>Jo&#227;o Silva &amp; Filhos</Name></Owner>
        <CreationDate>2019-11-18T03:00:00.000Z</CreationDate><KeyOwnershipDate>2019-11-18T03:00:00.000Z</KeyOwnershipDate>
        <OpenClaimCreationDate>2019-11-19T03:00:00.000Z</OpenClaimCreationDate></Entry>
        <Statistics><LastUpdated>2020-01-17T10:00:00.000Z</LastUpdated><Counters>
        <Counter type="SETTLEMENTS" by="KEY" d3="0" d30="5" m6="30"/></Counters></Statistics></GetEntryResponse>"#;

    #[test]
    fn the_specs_entry_reads_whole() {
        let e = entry(SPEC_ENTRY).unwrap();
        assert_eq!((e.key.as_str(), e.key_type.as_str()), ("11122233300", "CPF"));
        assert_eq!(e.account.branch.as_deref(), Some("0001"));
        assert_eq!(e.owner.name, "João Silva & Filhos");
        assert_eq!(e.open_claim_creation_date.as_deref(), Some("2019-11-19T03:00:00.000Z"));
    }

    #[test]
    fn a_missing_element_or_broken_xml_is_named() {
        let no_key = SPEC_ENTRY.replace("<Key>11122233300</Key>", "");
        assert!(matches!(entry(&no_key), Err(XmlError::Missing(p)) if p == "Entry/Key"));
        assert!(matches!(entry("<GetEntryResponse><Entry>"), Err(XmlError::Malformed(_))));
    }

    #[test]
    fn policies_and_problems_read() {
        let xml = "<ListPoliciesResponse><Category>F</Category><Policies><Policy><AvailableTokens>7</AvailableTokens>\
            <Capacity>1000</Capacity><RefillTokens>2</RefillTokens><RefillPeriodSec>60</RefillPeriodSec>\
            <Name>ENTRIES_READ_PARTICIPANT_ANTISCAN</Name></Policy></Policies></ListPoliciesResponse>";
        let p = policies(xml).unwrap();
        assert_eq!(p.category, "F");
        assert_eq!(p.policies[0].available, 7);
        let problem = "<problem xmlns=\"urn:ietf:rfc:7807\"><type>https://dict.pi.rsfn.net.br/api/v1/error/RateLimited</type>\
            <title>Rate limited</title><status>429</status></problem>";
        assert_eq!(problem_type(problem).as_deref(), Some("RateLimited"));
    }
}
