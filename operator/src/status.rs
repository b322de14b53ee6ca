//! Conditions with Kubernetes semantics: `lastTransitionTime` moves only when a condition's
//! status flips, so an unchanged state produces an identical status (and no write).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

pub fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_owned();
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_on_a_flip() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap());
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
        let first = condition(&[], "Ready", false, "Rolling", "x".into(), Some(1), &t0);
        let same = condition(
            std::slice::from_ref(&first),
            "Ready",
            false,
            "Rolling",
            "y".into(),
            Some(2),
            &t1,
        );
        assert_eq!(same.last_transition_time, t0);
        let flipped = condition(&[same], "Ready", true, "Ready", "z".into(), Some(2), &t1);
        assert_eq!(flipped.last_transition_time, t1);
    }
}
