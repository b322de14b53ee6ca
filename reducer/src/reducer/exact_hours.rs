//! The exact path in the loop: records of the exact-hours topic, long windows composed of
//! exact and streaming hours, and the grading of each hour once both are known. An hour that
//! becomes exact returns the publications to compose again; the loop publishes them.

use topk_api::record::ExactHourManifest;
use topk_engine::event::{format_rfc3339_ms, parse_rfc3339_ms};

use super::{Composed, GRADES_KEPT, Reducer};
use crate::error::Error;
use crate::exact::{LongParts, closed_part, compose, grade, plan_hours, union_tops};
use crate::hours::Ingested;
use crate::state::Publication;

impl Reducer {
    /// The hours `[start, end)` of a composable window's publication that are closed (the
    /// rest, of a refreshed list, is its head); `None` for an all-time window with no data.
    pub(super) fn closed_hours(&self, w: usize, publication: &Publication) -> Option<(i64, i64)> {
        closed_part(
            self.settings.merge.window_lengths[w],
            self.settings.bucket_ms[w],
            publication.window_end_ms,
            publication.head.as_ref().map(|head| head.hour_ms),
            self.hours.first_data_hour(),
        )
    }

    /// A long window's lists at one end as exact closed hours plus the open hours' streaming
    /// estimates (and, for a refreshed list, its head's), with the end of the exact run; `None`
    /// keeps the streaming lists (no hour of the window is exact yet, or one is unknown).
    pub(super) fn compose_window(
        &self,
        w: usize,
        publication: &Publication,
    ) -> Result<Option<Composed>, Error> {
        let hours = &self.hours;
        let first = hours.first_data_hour();
        let all_time = self.settings.merge.window_lengths[w].is_none();
        let Some((start, end)) = self.closed_hours(w, publication) else {
            return Ok(None);
        };
        let Some(plan) = plan_hours(start, end, first, |h| hours.state(h)) else {
            return Ok(None);
        };
        // The all-time exact part is the sum over every exact hour: only usable up to `end`.
        if all_time && hours.newest_exact().is_some_and(|h| h >= end) {
            return Ok(None);
        }
        let mut open = Vec::with_capacity(plan.open.len() + 1);
        for hour in &plan.open {
            match hours.streaming(*hour)? {
                Some(list) => open.push(list),
                None => return Ok(None),
            }
        }
        open.extend(publication.head.clone());
        let denied = |key: &str| self.merge.denied(key);
        let k = self.settings.merge.k;
        let rankings = if all_time {
            let parts = LongParts {
                streaming: &publication.rankings,
                exact_candidates: hours.all_time_tops(),
                open: &open,
                k,
            };
            compose(&parts, &denied, |scope, key| {
                hours.all_time_count(scope, key)
            })?
        } else {
            let mut tops = Vec::with_capacity(plan.exact.len());
            for hour in &plan.exact {
                tops.push(hours.tops(*hour)?);
            }
            let candidates = union_tops(tops);
            let parts = LongParts {
                streaming: &publication.rankings,
                exact_candidates: &candidates,
                open: &open,
                k,
            };
            compose(&parts, &denied, |scope, key| {
                plan.exact
                    .iter()
                    .map(|hour| hours.exact_count(*hour, scope, key))
                    .sum::<Result<u64, Error>>()
            })?
        };
        Ok(Some((rankings, plan.exact_until_ms)))
    }

    /// One record of the exact-hours topic: a chunk is staged, a manifest makes its hour exact
    /// and returns the publications to compose again with it. Records that cannot be used are
    /// counted, logged and skipped.
    pub(super) fn exact_hours_record(
        &mut self,
        key: Option<&[u8]>,
        payload: &[u8],
        offset: i64,
    ) -> Result<Vec<Publication>, Error> {
        let key = key.and_then(|k| std::str::from_utf8(k).ok()).unwrap_or("");
        let parsed = key
            .rsplit_once('/')
            .and_then(|(hour, part)| Some((hour, parse_rfc3339_ms(hour)?, part)));
        let skip = |this: &mut Self, why: String| -> Result<Vec<Publication>, Error> {
            this.shared.metrics.exact_hour_errors.inc();
            tracing::warn!(key, offset, why, "exact-hours record skipped");
            this.hours.skip_to(offset + 1)?;
            Ok(Vec::new())
        };
        let Some((hour, hour_ms, part)) = parsed else {
            return skip(self, "the key is not HOUR/CHUNK or HOUR/manifest".into());
        };
        if part != "manifest" {
            return match part.parse::<u32>() {
                Ok(chunk) => {
                    self.hours.stage_chunk(hour_ms, chunk, payload)?;
                    Ok(Vec::new())
                }
                Err(_) => skip(self, format!("unknown part {part:?}")),
            };
        }
        let manifest: ExactHourManifest = match serde_json::from_slice(payload) {
            Ok(m) => m,
            Err(err) => return skip(self, format!("unreadable manifest: {err}")),
        };
        if manifest.metric != self.settings.merge.metric || manifest.hour != hour {
            return skip(
                self,
                format!("manifest of {} {}", manifest.metric, manifest.hour),
            );
        }
        match self.hours.ingest(hour_ms, &manifest, offset + 1) {
            Ok(ingested) => self.hour_became_exact(ingested, &manifest),
            Err(err @ (Error::IncompleteHour { .. } | Error::Json(_))) => {
                skip(self, err.to_string())
            }
            Err(err) => Err(err),
        }
    }

    /// Grades the hour; returns the last publication of every window that holds it, to
    /// compose again.
    fn hour_became_exact(
        &mut self,
        ingested: Ingested,
        manifest: &ExactHourManifest,
    ) -> Result<Vec<Publication>, Error> {
        let hour = ingested.hour_ms;
        self.shared.metrics.exact_hours.inc();
        self.shared.metrics.recounted(hour, manifest);
        tracing::info!(
            hour = manifest.hour,
            counted = manifest.counted,
            keys = manifest.keys,
            replaced = ingested.replaced,
            "hour is exact"
        );
        self.grade_hour(hour)?;
        Ok(self
            .last_streaming
            .iter()
            .filter(|(w, p)| {
                self.closed_hours(**w, p)
                    .is_none_or(|(start, end)| (start..end).contains(&hour))
            })
            .map(|(_, p)| p.clone())
            .collect())
    }

    /// Grades the hour's streaming list against its exact counts, once both are known.
    pub(super) fn grade_hour(&mut self, hour_ms: i64) -> Result<(), Error> {
        if !self.hours.is_exact(hour_ms) {
            return Ok(());
        }
        let Some(streaming) = self.hours.streaming(hour_ms)? else {
            return Ok(());
        };
        let tops = self.hours.tops(hour_ms)?;
        let hours = &self.hours;
        let denied = |key: &str| self.merge.denied(key);
        let result = grade(
            &streaming,
            &tops,
            self.settings.merge.k,
            &denied,
            |scope, key| hours.exact_count(hour_ms, scope, key),
        )?;
        let metrics = &self.shared.metrics;
        metrics.grade_recall.set(result.recall_at_k);
        metrics.grade_max_overcount.set(result.max_overcount as i64);
        metrics
            .grade_overcount_bound
            .set(result.overcount_bound as i64);
        metrics
            .grade_rank_displacement
            .set(i64::from(result.max_rank_displacement));
        metrics.graded_hour_seconds.set(hour_ms / 1000);
        if result.bound_violated {
            metrics.grade_bound_violations.inc();
        }
        if result.bound_violated {
            tracing::warn!(
                hour = format_rfc3339_ms(hour_ms),
                recall = result.recall_at_k,
                overcount = result.max_overcount,
                bound = result.overcount_bound,
                "the streaming list of the hour fell short of its exact counts"
            );
        }
        let mut grades = self
            .shared
            .grades
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        grades.retain(|g| g.hour_ms != hour_ms);
        grades.push_back(result);
        grades.make_contiguous().sort_by_key(|g| g.hour_ms);
        while grades.len() > GRADES_KEPT {
            grades.pop_front();
        }
        Ok(())
    }
}
