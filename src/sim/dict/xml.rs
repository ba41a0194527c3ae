//! The simulated DICT's XML answers, shaped as spec 1.8.0's examples:
//! `GetEntryResponse`, `ListPoliciesResponse` / `GetPolicyResponse`, and RFC 7807
//! problems (`https://dict.pi.rsfn.net.br/api/v1/error/{Type}`).

use std::fmt::Write as _;

use quick_xml::escape::escape;

use super::directory::Entry;
use super::policies::BucketState;

/// Prefix of every problem `type`.
pub const ERROR_BASE: &str = "https://dict.pi.rsfn.net.br/api/v1/error/";

const DATE: &str = "2019-11-18T03:00:00.000Z";

pub fn entry(e: &Entry, now: &str, correlation: &str) -> String {
    let branch = format!("<Branch>{}</Branch>", e.branch);
    let trade = e.trade_name.as_deref().map(|t| format!("<TradeName>{}</TradeName>", escape(t))).unwrap_or_default();
    let claim =
        if e.open_claim { format!("<OpenClaimCreationDate>{now}</OpenClaimCreationDate>") } else { String::new() };
    let mut counters = String::new();
    for kind in ["SETTLEMENTS", "REPORTED_FRAUDS", "CONFIRMED_FRAUDS"] {
        for by in ["KEY", "OWNER", "ACCOUNT"] {
            let _ = write!(counters, r#"<Counter type="{kind}" by="{by}" d3="0" d30="0" m6="0"/>"#);
        }
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<GetEntryResponse><Signature></Signature>\
         <ResponseTime>{now}</ResponseTime><CorrelationId>{correlation}</CorrelationId>\
         <Entry><Key>{key}</Key><KeyType>{kt}</KeyType><Account><Participant>{p}</Participant>{branch}\
         <AccountNumber>{acc}</AccountNumber><AccountType>{at}</AccountType><OpeningDate>{DATE}</OpeningDate></Account>\
         <Owner><Type>{ot}</Type><TaxIdNumber>{tax}</TaxIdNumber><Name>{name}</Name>{trade}</Owner>\
         <CreationDate>{DATE}</CreationDate><KeyOwnershipDate>{DATE}</KeyOwnershipDate>{claim}</Entry>\
         <Statistics><LastUpdated>{now}</LastUpdated><Counters>{counters}</Counters></Statistics></GetEntryResponse>",
        key = escape(&e.key),
        kt = e.key_type,
        p = e.participant,
        acc = e.account_number,
        at = e.account_type,
        ot = e.owner_type,
        tax = e.tax_id,
        name = escape(&e.name),
    )
}

fn policy(s: &BucketState) -> String {
    format!(
        "<Policy><AvailableTokens>{}</AvailableTokens><Capacity>{}</Capacity><RefillTokens>{}</RefillTokens>\
         <RefillPeriodSec>{}</RefillPeriodSec><Name>{}</Name></Policy>",
        s.available, s.capacity, s.refill_tokens, s.refill_period_sec, s.name
    )
}

pub fn policies(category: &str, states: &[BucketState], now: &str, correlation: &str) -> String {
    let list: String = states.iter().map(policy).collect();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListPoliciesResponse><Signature></Signature>\
         <CorrelationId>{correlation}</CorrelationId><ResponseTime>{now}</ResponseTime><Category>{category}</Category>\
         <Policies>{list}</Policies></ListPoliciesResponse>"
    )
}

pub fn one_policy(category: &str, state: &BucketState, now: &str, correlation: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<GetPolicyResponse><Signature></Signature>\
         <CorrelationId>{correlation}</CorrelationId><ResponseTime>{now}</ResponseTime><Category>{category}</Category>\
         {}</GetPolicyResponse>",
        policy(state)
    )
}

pub fn problem(kind: &str, title: &str, status: u16, detail: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<problem xmlns=\"urn:ietf:rfc:7807\"><type>{ERROR_BASE}{kind}</type>\
         <title>{title}</title><status>{status}</status><detail>{}</detail></problem>",
        escape(detail)
    )
}
