// The one job pump of the scheduler-backed routes. See job_pump.h.
#include "server/job_pump.h"

#include <chrono>
#include <utility>

#include "server/metrics.h"  // kRejected

namespace bonsai::server {

using Clock = engine::Clock;

Clock::time_point deadline_after(Clock::time_point t, double seconds) {
  constexpr double kMaxSeconds = 1e9;
  if (!(seconds < kMaxSeconds)) seconds = kMaxSeconds;  // also NaN
  if (seconds < 0) seconds = 0;
  return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

ApiError submit_refusal(ServerContext& ctx, const std::string& model_id, const core::Error& e) {
  if (e.code == core::Errc::kResourceExhausted) {
    ctx.metrics.inc(metric::kRejected, {{"model", model_id}});
    return overloaded("Model '" + model_id + "' is overloaded: " + e.message + ". Retry later.", "overloaded", 1);
  }
  return from_core_error(e, 500);
}

void ServerContext::cut_all_jobs() {
  std::vector<std::shared_ptr<JobPump>> all;
  {
    std::lock_guard lock(jobs_mu);
    all.assign(jobs.begin(), jobs.end());
  }
  for (auto& p : all) p->cut(CutReason::kShutdown);
}

JobPump::JobPump(ServerContext& ctx, HttpTransport& http, std::shared_ptr<Exchange> ex,
                 std::shared_ptr<engine::JobHandle> handle, int n, std::shared_ptr<JobAnswer> answer)
    : ctx_(ctx), http_(http), ex_(std::move(ex)), handle_(std::move(handle)), answer_(std::move(answer)) {
  pr_.done.assign(static_cast<size_t>(n), std::nullopt);
}

void JobPump::start(ServerContext& ctx, HttpTransport& http, const std::shared_ptr<Exchange>& ex,
                    std::shared_ptr<engine::JobHandle> handle, int n, std::shared_ptr<JobAnswer> answer) {
  auto pump = std::make_shared<JobPump>(ctx, http, ex, std::move(handle), n, std::move(answer));
  {
    std::lock_guard lock(ctx.jobs_mu);
    ctx.jobs.insert(pump);
  }
  pump->answer_->start(*pump);
  std::weak_ptr<JobPump> weak = pump;
  ex->on_disconnect([weak] {
    if (auto p = weak.lock()) p->cut(CutReason::kClientGone);
  });
  pump->handle_->set_notify([weak] {
    if (auto p = weak.lock()) p->kick();
  });
  pump->kick();
  if (ctx.stopping) pump->cut(CutReason::kShutdown);  // stop() may have swept the registry before the insert
}

void JobPump::kick() {
  {
    std::lock_guard lock(mu_);
    if (finished_) return;
    if (queued_) {
      again_ = true;
      return;
    }
    queued_ = true;
  }
  http_.post([self = shared_from_this()] { self->run(); });
}

void JobPump::cut(CutReason why) {
  int none = static_cast<int>(CutReason::kNone);
  cut_request_.compare_exchange_strong(none, static_cast<int>(why));
  kick();
}

void JobPump::run() {
  for (;;) {
    step();
    std::lock_guard lock(mu_);
    if (again_ && !finished_) {
      again_ = false;
      continue;
    }
    queued_ = false;
    return;
  }
}

void JobPump::step() {
  if (const int c = cut_request_.load(); c != 0 && !cancelled_) {
    cancelled_ = true;
    pr_.cut = static_cast<CutReason>(c);
    answer_->on_cut(pr_.cut);
    handle_->cancel();
  }
  if (answer_->hold(*this)) return;
  std::vector<engine::JobEvent> evs;
  // Read before wait(): if the job had already ended, wait() returns
  // every event it will ever have.
  const bool ended_before = handle_->ended();
  handle_->wait(evs, Clock::now());
  take(evs);
  const int n = static_cast<int>(pr_.done.size());
  if (ended_before && pr_.n_done < n && !pr_.failed) {
    // The scheduler ended the job without an answer for every choice:
    // never hang the client on it.
    pr_.failed = core::Error{core::Errc::kInternal, answer_->missing_result_message()};
  }
  if (pr_.n_done >= n || pr_.failed) finish();
}

void JobPump::take(std::vector<engine::JobEvent>& evs) {
  for (auto& e : evs) {
    pr_.started = true;
    switch (e.kind) {
      case engine::JobEvent::Kind::kText:
        if (!cancelled_ && !answer_->on_text(e)) {
          pr_.cut = CutReason::kClientGone;
          cancelled_ = true;
          handle_->cancel();
        }
        break;
      case engine::JobEvent::Kind::kDone:
        if (!pr_.done[static_cast<size_t>(e.choice)]) ++pr_.n_done;
        pr_.done[static_cast<size_t>(e.choice)] = std::move(e.result);
        break;
      case engine::JobEvent::Kind::kFailed:
        pr_.failed = e.error;
        break;
    }
  }
}

void JobPump::finish() {
  {
    std::lock_guard lock(mu_);
    if (finished_) return;
    finished_ = true;
  }
  handle_->set_notify(nullptr);
  answer_->finish(*this, pr_);
  handle_.reset();
  std::shared_ptr<JobPump> self = shared_from_this();
  {
    std::lock_guard lock(ctx_.jobs_mu);
    ctx_.jobs.erase(self);
  }
  ctx_.jobs_cv.notify_all();
}

// ---- ChatJobAnswer ----------------------------------------------------------

bool ChatJobAnswer::hold(JobPump& pump) {
  if (!(stream_ && alive_ && ex_->over_high_water())) return false;
  std::weak_ptr<JobPump> weak = pump.weak_from_this();
  ex_->on_drain([weak] {
    if (auto p = weak.lock()) p->kick();
  });
  return true;
}

void ChatJobAnswer::on_cut(CutReason why) {
  if (why == CutReason::kClientGone) alive_ = false;
}

void ChatJobAnswer::open_stream() {
  if (headers_sent_) return;
  headers_sent_ = true;
  begin_stream();
}

bool ChatJobAnswer::on_text(const engine::JobEvent& ev) {
  if (!stream_) return true;  // parsed from the result at the end
  open_stream();
  take(parser_.feed(ev.text));
  return alive_;
}

std::optional<ApiError> ChatJobAnswer::failure(JobPump& pump, const JobProgress& pr) const {
  const bool gone = pr.cut == CutReason::kClientGone;
  if (pr.failed) return job_failure_error(pump.context(), *pr.failed, chat_.model, gone);
  if (pr.done.empty() || !pr.done[0] || pr.done[0]->finish_reason == engine::FinishReason::kCancelled)
    return job_cut_error(gone);
  return std::nullopt;
}

void ChatJobAnswer::finish(JobPump& pump, JobProgress& pr) {
  if (chat_.account) chat_.account(pr);
  const std::optional<ApiError> err = failure(pump, pr);
  if (err && !headers_sent_) {  // not streamed yet: a status and one error body
    before_error_end();
    HttpResponse res;
    write_error_(res, *err);
    ex_->respond(std::move(res));
  } else if (err) {
    before_error_end();
    if (pr.cut != CutReason::kClientGone) stream_error(*err);
    ex_->end_stream();
  } else {
    const engine::GenerationResult& r = *pr.done[0];
    if (stream_) open_stream();  // a generation that released no text opens it here
    if (!stream_) take(parser_.feed(r.text));
    take(parser_.finish());
    complete(r);
  }
  chat_ = SubmittedChat{};  // the model and the job go now
}

void add_job_route(HttpTransport& http, ServerContext& ctx, const std::string& path, JobSubmitter submit,
                   ErrorWriter write_error) {
  http.route("POST", path, [&ctx, &http, submit = std::move(submit), write_error](const std::shared_ptr<Exchange>& ex) {
    const HttpRequest& req = ex->request();
    HttpResponse res;
    if (req.is_multipart()) {
      write_error(res, bad_request("The request body must be JSON (got multipart/form-data).", {}, "invalid_json"));
      return ex->respond(std::move(res));
    }
    if (ctx.stopping) {
      write_error(res, overloaded("The server is shutting down.", "shutting_down", 5));
      return ex->respond(std::move(res));
    }
    if (ctx.draining) {
      write_error(res, draining_error());
      return ex->respond(std::move(res));
    }
    auto job = submit(req.body, res, Clock::now());
    if (!job) return ex->respond(std::move(res));
    JobPump::start(ctx, http, ex, std::move(job->handle), job->n, std::move(job->answer));
  });
}

}  // namespace bonsai::server
