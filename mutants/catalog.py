"""The mutants: realistic bugs in the lifecycle, the batcher and the worker, each with the tests that must catch it.

A mutant is one exact textual substitution in one source file. ``pattern`` must occur exactly once in that
file: when the source changes so that it no longer does, the check stops and says so (the catalogue has
drifted and needs updating), instead of silently testing nothing. ``tests`` are the pytest node ids that
can catch the mutant, the most likely killer first (the run stops at the first failure).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    bug: str
    pattern: str
    replacement: str
    tests: tuple[str, ...]


LIFECYCLE = "scorekit/lifecycle.py"
ASGI = "scorekit/asgi.py"
BATCHING = "scorekit/batching.py"
JOBS = "scorekit/jobs.py"
WORKER = "scorekit/worker.py"

_HOLES = "tests/property/test_lifecycle_holes.py::"
_QUEUE = "tests/property/test_receive_queue.py::"
_CANCEL = "tests/property/test_cancellation.py::"
_LOAD = "tests/property/test_load.py::"
_REENTRY = "tests/property/test_reentry.py::"
_RESPONSE = "tests/property/test_response.py::"
_REGRESSIONS = "tests/property/test_regressions.py::"
_BATCHING = "tests/unit/test_batching.py"
_WORKER = "tests/unit/test_worker.py"
_WORKER_DEATH = "tests/unit/test_worker_death.py"
_QUEUE_WAIT = "tests/unit/test_queue_wait.py"

MUTANTS: tuple[Mutant, ...] = (
    # -- the lifecycle: the six that once survived the whole suite --------------------------------------
    Mutant(
        "L01",
        LIFECYCLE,
        "receive() answers http.disconnect while body chunks are still buffered (the body's tail is dropped)",
        "if self.disconnected and not self._buffer:",
        "if self.disconnected:",
        (_HOLES + "test_Q15_buffered_body_before_disconnect",),
    ),
    Mutant(
        "L02",
        LIFECYCLE,
        "an OSError from the server's send no longer marks the client gone",
        "        except OSError:\n            self._mark_gone(cancel=False)\n            raise",
        "        except OSError:\n            raise",
        (_HOLES + "test_C7_send_error_marks_client_gone",),
    ),
    Mutant(
        "L03",
        LIFECYCLE,
        "an OSError from the server's send cancels the app as well",
        "self._mark_gone(cancel=False)",
        "self._mark_gone(cancel=True)",
        (_HOLES + "test_C8_send_error_does_not_cancel",),
    ),
    Mutant(
        "L04",
        LIFECYCLE,
        "set_route relabels the load on every call instead of the first",
        "        if self.route is None:\n            self.route = route\n            self._load.enter_route(route)",
        "        self.route = route\n        self._load.enter_route(route)",
        (_HOLES + "test_L5_first_route_label_wins",),
    ),
    Mutant(
        "L05",
        LIFECYCLE,
        "the pump's guard catches only OSError: any other error from the server's receive escapes the task group",
        "        except Exception:\n            logger.debug(",
        "        except OSError:\n            logger.debug(",
        (_HOLES + "test_C9_receive_error_is_a_disconnect",),
    ),
    Mutant(
        "L06",
        LIFECYCLE,
        "wait_disconnect() returns on any buffer change, not only on a disconnect",
        "        while not self.disconnected:\n            await self._event().wait()",
        "        if not self.disconnected:\n            await self._event().wait()",
        (_HOLES + "test_Q16_wait_disconnect_waits_for_disconnect",),
    ),
    # -- the lifecycle: receive() and the buffer ------------------------------------------------------
    Mutant(
        "L07",
        LIFECYCLE,
        "receive() takes a buffered chunk without a checkpoint: a poll from a cancelled scope swallows it",
        "            await anyio.lowlevel.checkpoint_if_cancelled()\n",
        "",
        (_QUEUE + "test_Q10_cancelled_poll_is_lossless",),
    ),
    Mutant(
        "L08",
        LIFECYCLE,
        "the disconnect answer no longer lets a pending cancellation land first (flavours disagree)",
        '                    await anyio.lowlevel.checkpoint()\n                return {"type": "http.disconnect"}',
        '                    pass\n                return {"type": "http.disconnect"}',
        (_REGRESSIONS + "test_Q12_disconnect_seen_alike_with_two_readers",),
    ),
    Mutant(
        "L09",
        LIFECYCLE,
        "the extra checkpoint before the disconnect answer is taken even when the app will not be cancelled",
        "if self.client_gone and self.cancel_on_disconnect:",
        "if self.client_gone:",
        (_QUEUE + "test_Q7_disconnect_stays",),
    ),
    Mutant(
        "L10",
        LIFECYCLE,
        "receive() forgets that the app asked: the pump never reads past the first message",
        "        self._app_asked = True\n",
        "",
        (_CANCEL + "test_C10_busy_reader_is_cancelled_within_k_ticks",),
    ),
    Mutant(
        "L11",
        LIFECYCLE,
        "receive() does not start the pump: with Expect: 100-continue the body is never read",
        "        self._app_asked = True\n        self._start_pump()\n",
        "        self._app_asked = True\n",
        (_QUEUE + "test_Q14_expect_continue_waits_for_app",),
    ),
    Mutant(
        "L12",
        LIFECYCLE,
        "taking a chunk does not wake the pump: a reader waiting for room waits for ever",
        '                self.buffered_bytes -= len(message["body"])\n                self._notify()\n',
        '                self.buffered_bytes -= len(message["body"])\n',
        (_QUEUE + "test_Q11_buffer_bounded",),
    ),
    Mutant(
        "L13",
        LIFECYCLE,
        "taking a chunk does not release its bytes: the buffer looks full for ever",
        '                self.buffered_bytes -= len(message["body"])\n',
        "",
        (_QUEUE + "test_Q11_buffer_bounded",),
    ),
    Mutant(
        "L14",
        LIFECYCLE,
        "unbounded read-ahead: the pump reads whatever the app does",
        "        return self._app_asked and self.buffered_bytes < self._max_buffer_bytes",
        "        return True",
        (_QUEUE + "test_Q11_buffer_bounded",),
    ),
    Mutant(
        "L15",
        LIFECYCLE,
        "the pump reads ahead before the app asked (up to the byte cap)",
        "        return self._app_asked and self.buffered_bytes < self._max_buffer_bytes",
        "        return self.buffered_bytes < self._max_buffer_bytes",
        (_QUEUE + "test_Q11_buffer_bounded",),
    ),
    Mutant(
        "L16",
        LIFECYCLE,
        "no byte cap once the app asked",
        "        return self._app_asked and self.buffered_bytes < self._max_buffer_bytes",
        "        return self._app_asked",
        (_QUEUE + "test_Q11_buffer_bounded",),
    ),
    Mutant(
        "L17",
        LIFECYCLE,
        "the pump checks for room once instead of until there is room",
        "            while self._reading or not self._may_read_ahead():\n                await self._event().wait()",
        "            if self._reading or not self._may_read_ahead():\n                await self._event().wait()",
        (_QUEUE + "test_Q11_buffer_bounded",),
    ),
    Mutant(
        "L18",
        LIFECYCLE,
        "the pump reads once more after an app task read http.disconnect while it waited",
        "            if not self.disconnected:\n                await self._read()",
        "            await self._read()",
        (_QUEUE + "test_Q2_no_receive_after_disconnect",),
    ),
    Mutant(
        "L19",
        LIFECYCLE,
        "stray http.request messages after the end of the body are buffered for the app",
        'if kind == "http.request" and not self.body_complete:',
        'if kind == "http.request":',
        (_QUEUE + "test_Q13_stray_requests_ignored", _QUEUE + "test_Q6_single_terminator"),
    ),
    Mutant(
        "L20",
        LIFECYCLE,
        "an omitted more_body is read as True (the spec's default is False)",
        'more_body = bool(message.get("more_body", False))',
        'more_body = bool(message.get("more_body", True))',
        (_QUEUE + "test_Q6_single_terminator", _QUEUE + "test_Q3_body_is_prefix"),
    ),
    Mutant(
        "L21",
        LIFECYCLE,
        'an omitted body key raises instead of meaning b""',
        'body: bytes = message.get("body", b"")',
        'body: bytes = message["body"]',
        (_QUEUE + "test_Q6_single_terminator", _QUEUE + "test_Q3_body_is_prefix"),
    ),
    Mutant(
        "L22",
        LIFECYCLE,
        "an empty final message is not buffered: the app never sees the end of the body",
        "        if body or not more_body:\n",
        "        if body:\n",
        (_QUEUE + "test_Q6_single_terminator", _QUEUE + "test_Q3_body_is_prefix"),
    ),
    Mutant(
        "L23",
        LIFECYCLE,
        "a buffered chunk wakes nobody",
        "            self.buffered_bytes += len(body)\n        self._notify()\n",
        "            self.buffered_bytes += len(body)\n",
        (_QUEUE + "test_Q3_body_is_prefix", _QUEUE + "test_Q6_single_terminator"),
    ),
    Mutant(
        "L24",
        LIFECYCLE,
        "a notification replaces the event without setting the old one: waiters sleep through it",
        "            self._changed.set()\n            self._changed = None",
        "            self._changed = None",
        (_QUEUE + "test_Q3_body_is_prefix", _QUEUE + "test_Q8_disconnect_wakes_every_waiter"),
    ),
    # -- the lifecycle: disconnect and cancellation -------------------------------------------------------
    Mutant(
        "L25",
        LIFECYCLE,
        "a disconnect after the response is complete still cancels the app",
        "        self.disconnected = True\n        if not self.response_complete:\n",
        "        self.disconnected = True\n        if True:\n",
        (_CANCEL + "test_C2_no_cancel_after_final_body",),
    ),
    Mutant(
        "L26",
        LIFECYCLE,
        "a disconnect cancels the app although cancel_on_disconnect is off",
        "if cancel and self.cancel_on_disconnect:",
        "if cancel:",
        (_QUEUE + "test_Q7_disconnect_stays", _QUEUE + "test_Q8_disconnect_wakes_every_waiter"),
    ),
    Mutant(
        "L27",
        LIFECYCLE,
        "no cancel on disconnect: the app runs on after its client left",
        "                self.app_scope.cancel()\n",
        "                pass\n",
        (_CANCEL + "test_C1_disconnect_cancels_within_k_ticks",),
    ),
    Mutant(
        "L28",
        LIFECYCLE,
        "a disconnect wakes nobody: app tasks waiting in receive() sleep on",
        "                self.app_scope.cancel()\n        self._notify()\n",
        "                self.app_scope.cancel()\n",
        (_QUEUE + "test_Q8_disconnect_wakes_every_waiter", _QUEUE + "test_Q7_disconnect_stays"),
    ),
    Mutant(
        "L29",
        LIFECYCLE,
        "the app's exception is raised inside the task group (it comes out wrapped in an ExceptionGroup)",
        "                    app_error = exc\n",
        "                    raise\n",
        (_CANCEL + "test_C4_returns_normally_or_raises_unwrapped",),
    ),
    Mutant(
        "L30",
        LIFECYCLE,
        "the pump is not stopped when the app returns: the middleware waits on it for ever",
        "            task_group.cancel_scope.cancel()\n        self._task_group = None",
        "        self._task_group = None",
        (_CANCEL + "test_C3_no_orphan_tasks", _QUEUE + "test_Q3_body_is_prefix"),
    ),
    Mutant(
        "L31",
        LIFECYCLE,
        "the pump starts eagerly even with Expect: 100-continue",
        "            if not _expects_continue(scope):\n                self._start_pump()",
        "            self._start_pump()",
        (_QUEUE + "test_Q14_expect_continue_waits_for_app",),
    ),
    Mutant(
        "L32",
        LIFECYCLE,
        "a pump made each time the app asks: the extra pumps outlive the request",
        "        if self._pump_started:\n            return\n",
        "",
        (_CANCEL + "test_C3_no_orphan_tasks", _QUEUE + "test_Q1_single_server_waiter"),
    ),
    # -- the lifecycle: response completion -----------------------------------------------------------
    # The rule is scorekit.asgi.completes_response, which the fake servers share: P1 checks the middleware's
    # flag against the response forms the app sent, so a mutant there cannot hide behind an agreeing fake.
    Mutant(
        "L33",
        ASGI,
        "the final body counts as the end of the response although trailers were announced",
        'return not message.get("more_body", False) and not expect_trailers',
        'return not message.get("more_body", False)',
        (_RESPONSE + "test_P1_every_terminal_form_completes",),
    ),
    Mutant(
        "L34",
        ASGI,
        "the first trailers message completes the response",
        'return not message.get("more_trailers", False)',
        "return True",
        (_RESPONSE + "test_P1_every_terminal_form_completes",),
    ),
    Mutant(
        "L35",
        ASGI,
        "http.response.pathsend does not complete the response",
        'return kind == "http.response.pathsend"',
        "return False",
        (_RESPONSE + "test_P1_every_terminal_form_completes",),
    ),
    Mutant(
        "L36",
        ASGI,
        "zerocopysend does not complete the response",
        'if kind in ("http.response.body", "http.response.zerocopysend"):',
        'if kind == "http.response.body":',
        (_RESPONSE + "test_P1_every_terminal_form_completes",),
    ),
    Mutant(
        "L37",
        LIFECYCLE,
        "the trailers flag of http.response.start is ignored",
        'self._expect_trailers = bool(message.get("trailers", False))',
        "self._expect_trailers = False",
        (_RESPONSE + "test_P1_every_terminal_form_completes",),
    ),
    # -- the lifecycle: ownership, re-entry and load ----------------------------------------------------
    Mutant(
        "L38",
        LIFECYCLE,
        "a re-entered layer with the tag in its scope owns the request again (double load, second reader)",
        'if scope["type"] != "http" or SCOPE_KEY in scope:',
        'if scope["type"] != "http":',
        (_LOAD + "test_L4_one_plus_one_minus_per_request", _REENTRY + "test_R1_reentered_layer_passes_through"),
    ),
    Mutant(
        "L39",
        LIFECYCLE,
        "a rebuilt scope (tag dropped) is not recognised by its receive: a second owner",
        "        if isinstance(owner, Lifecycle):\n",
        "        if isinstance(owner, LifecycleMiddleware):\n",
        (_LOAD + "test_L4_one_plus_one_minus_per_request", _REENTRY + "test_R1_reentered_layer_passes_through"),
    ),
    Mutant(
        "L40",
        LIFECYCLE,
        "a rebuilt scope is passed on without the tag restored (routes below cannot label the load)",
        "await self.app({**scope, SCOPE_KEY: owner}, receive, send)",
        "await self.app(scope, receive, send)",
        (_REGRESSIONS + "test_R1_rebuilt_scope_is_retagged",),
    ),
    Mutant(
        "L41",
        LIFECYCLE,
        "the tag is written into the caller's scope instead of a shallow copy",
        "            await lifecycle.run(self.app, {**scope, SCOPE_KEY: lifecycle})",
        "            scope[SCOPE_KEY] = lifecycle\n            await lifecycle.run(self.app, scope)",
        (_REENTRY + "test_R2_caller_scope_untouched", _REENTRY + "test_R3_fresh_lifecycle_per_request"),
    ),
    Mutant(
        "L42",
        LIFECYCLE,
        "a skipped decrement: the load never goes back down",
        "            lifecycle.release()\n            self.load.exit()",
        "            lifecycle.release()",
        (_LOAD + "test_L3_load_back_to_zero",),
    ),
    Mutant(
        "L43",
        LIFECYCLE,
        "the route label is never undone",
        "            lifecycle.release()\n            self.load.exit()",
        "            self.load.exit()",
        (_LOAD + "test_L3_load_back_to_zero", _LOAD + "test_L1_load_never_negative"),
    ),
    Mutant(
        "L44",
        LIFECYCLE,
        "on asyncio the pump task is not cancelled when the app returns: the middleware waits on it for ever",
        "                pump.cancel()\n",
        "",
        (_CANCEL + "test_C3_no_orphan_tasks", _QUEUE + "test_Q3_body_is_prefix"),
    ),
    Mutant(
        "L45",
        LIFECYCLE,
        "on asyncio a pump start still scheduled when the app returns makes a pump nobody stops (an orphan)",
        "                self._pump_start.cancel()",
        "                pass",
        (_CANCEL + "test_C3_nothing_reads_after_return",),
    ),
    Mutant(
        "L46",
        LIFECYCLE,
        "an app task reads the server's receive inline while another task is already in it (two readers)",
        "            if not self._reading:\n                await self._read()",
        "            if True:\n                await self._read()",
        (_QUEUE + "test_Q1_single_server_waiter",),
    ),
    # -- the batcher and its jobs (jobs.py) ------------------------------------------------------------
    Mutant(
        "B01",
        JOBS,
        "a job's items are not sorted by length (more padding)",
        "deque(sorted(range(len(self.inputs)), key=lambda i: self.inputs[i].cost))",
        "deque(range(len(self.inputs)))",
        (_BATCHING,),
    ),
    Mutant(
        "B02",
        JOBS,
        "a delivered result does not count down: the job never finishes",
        "        self._remaining -= 1\n",
        "",
        (_WORKER,),
    ),
    Mutant(
        "B03",
        JOBS,
        "a late result after the job failed is still counted (notify twice, the error kept beside results)",
        "        if self.done:\n            return\n        self.results[index] = output",
        "        self.results[index] = output",
        (_WORKER_DEATH,),
    ),
    Mutant(
        "B04",
        JOBS,
        "a second failure overwrites the first and notifies again",
        "        if not self.done:\n            self.error = error\n            self._finish()",
        "        self.error = error\n        self._finish()",
        (_WORKER_DEATH,),
    ),
    Mutant(
        "B05",
        BATCHING,
        "the queue limit counts jobs instead of items",
        "if self._queued + len(job.inputs) > self.max_queued_items:",
        "if len(self._jobs) + len(job.inputs) > self.max_queued_items:",
        (_BATCHING,),
    ),
    Mutant(
        "B06",
        BATCHING,
        "a shut-down batcher still queues work that nobody will run",
        '            if self._closed:\n                raise QueueFull("the worker is shutting down")\n',
        "",
        (_BATCHING,),
    ),
    Mutant(
        "B07",
        BATCHING,
        "taking a job out (cancel, expire) forgets its items in the queue count",
        "            self._queued -= dropped\n",
        "",
        (_BATCHING, _QUEUE_WAIT),
    ),
    Mutant(
        "B08",
        BATCHING,
        "taking a job out (cancel, expire) leaves the emptied job in the queue",
        "            self._jobs.remove(job)\n",
        "",
        (_BATCHING, _QUEUE_WAIT),
    ),
    Mutant(
        "B09",
        BATCHING,
        "cancel does not mark the job cancelled (its results are not counted as wasted)",
        "            job.cancelled = True\n",
        "",
        (_WORKER_DEATH,),
    ),
    Mutant(
        "B10",
        BATCHING,
        "fail_all drops queued jobs without answering them",
        "                job._pending.clear()\n                job.fail(error)\n",
        "                job._pending.clear()\n",
        (_BATCHING,),
    ),
    Mutant(
        "B11",
        BATCHING,
        "fail_all leaves the batcher open: new work queues for a dead worker",
        "        with self._ready:\n            self._closed = True\n            jobs, self._jobs",
        "        with self._ready:\n            jobs, self._jobs",
        (_WORKER_DEATH + "::test_a_dying_worker_answers_the_batch_it_ran_and_every_queued_job", _BATCHING),
    ),
    Mutant(
        "B12",
        BATCHING,
        "no first pass of one item per job: a large job starves the others",
        "        for job in jobs:\n            if not take(job, self.max_batch_tokens):\n"
        "                full = True\n                break\n",
        "",
        (_BATCHING,),
    ),
    Mutant(
        "B13",
        BATCHING,
        "the fill pass takes the jobs with the most items left first",
        "key=lambda j: len(j._pending)",
        "key=lambda j: -len(j._pending)",
        (_BATCHING,),
    ),
    Mutant(
        "B14",
        BATCHING,
        "the token budget is checked without the item being added",
        "cost * (len(batch) + 1) > limit",
        "cost * len(batch) > limit",
        (_BATCHING,),
    ),
    Mutant(
        "B15",
        BATCHING,
        "padding is priced at the new item's length, not the batch's longest",
        "            cost = max(longest, job.inputs[index].cost)\n",
        "            cost = job.inputs[index].cost\n",
        (_BATCHING,),
    ),
    Mutant(
        "B16",
        BATCHING,
        "the batch size limit is off by one",
        "if len(batch) >= self.max_batch_size or",
        "if len(batch) > self.max_batch_size or",
        (_BATCHING,),
    ),
    Mutant(
        "B17",
        BATCHING,
        "drained jobs stay in the queue",
        "self._jobs = deque(job for job in self._jobs if job._pending)",
        "self._jobs = deque(self._jobs)",
        (_BATCHING,),
    ),
    Mutant(
        "B18",
        BATCHING,
        "the queue-wait deadline cuts a job whose first batch has run",
        "if job.done or job.started_at is not None or self.max_queue_wait is None:",
        "if job.done or self.max_queue_wait is None:",
        (_QUEUE_WAIT,),
    ),
    Mutant(
        "B19",
        BATCHING,
        "the batcher cuts overdue jobs into batches (only the event loop's timer expires them)",
        "                self._expire_overdue()\n",
        "",
        (_QUEUE_WAIT,),
    ),
    Mutant(
        "B20",
        BATCHING,
        "cut items stay in the queued-tokens gauge",
        "            self._queued_tokens -= job.inputs[index].cost\n",
        "",
        (_QUEUE_WAIT,),
    ),
    Mutant(
        "B21",
        BATCHING,
        "the batch that carries a new job is not cut short: the job waits a whole batch of the budget",
        "return ceiling, min(max(int((left - fixed) / per_token), 0), ceiling)",
        "return ceiling, ceiling",
        (_BATCHING,),
    ),
    Mutant(
        "B22",
        BATCHING,
        "the latency budget splits a small job that fits in one batch",
        "limit = ceiling if rank == 0 and self._completes(job, batch, longest, ceiling) else budget",
        "limit = budget",
        (_BATCHING,),
    ),
    Mutant(
        "B23",
        BATCHING,
        "the batch length ignores the fitted cost: batches are as long as the token limit allows",
        "ceiling = int(efficiency / (1 - efficiency) * fixed / per_token)",
        "ceiling = self.max_batch_tokens",
        (_BATCHING,),
    ),
    # -- the worker -------------------------------------------------------------------------------------
    Mutant(
        "W01",
        WORKER,
        "a dying worker leaves the jobs of the batch it was running unanswered",
        "                for item in batch:\n                    item.job.fail(failure)\n",
        "",
        (_WORKER_DEATH,),
    ),
    Mutant(
        "W02",
        WORKER,
        "a dying worker leaves the queued jobs unanswered",
        "            self._on_death(failure)\n",
        "",
        (_WORKER_DEATH,),
    ),
    Mutant(
        "W03",
        WORKER,
        "the worker's death is not recorded (/health stays 200)",
        "            self.death = exc\n",
        "",
        (_WORKER_DEATH,),
    ),
    Mutant(
        "W04",
        WORKER,
        "only Exception is handled on the way out: a SystemExit in the model leaves every request hanging",
        "        except BaseException as exc:\n            with self._lock:",
        "        except Exception as exc:\n            with self._lock:",
        (_WORKER_DEATH,),
    ),
    Mutant(
        "W05",
        WORKER,
        "after a model error the worker goes on to deliver (and dies)",
        '__name__})."))\n            return\n',
        '__name__})."))\n',
        (_WORKER,),
    ),
    Mutant(
        "W06",
        WORKER,
        "a failed batch is not counted",
        "                self.stats.failed_batches += 1\n",
        "",
        (_WORKER,),
    ),
    Mutant(
        "W07",
        WORKER,
        "outputs are delivered to the wrong items",
        "zip(batch, outputs, strict=True)",
        "zip(batch, reversed(outputs), strict=True)",
        (_WORKER,),
    ),
    Mutant(
        "W08",
        WORKER,
        "items of cancelled jobs are not counted as wasted work",
        "                    self.stats.items_of_cancelled_jobs += 1\n",
        "                    pass\n",
        (_WORKER_DEATH,),
    ),
    Mutant(
        "W09",
        WORKER,
        "the batch observer (metrics) is told the longest item instead of the padded tokens",
        "tokens = max(item.encoded.cost for item in batch) * len(batch)",
        "tokens = max(item.encoded.cost for item in batch)",
        (_WORKER_DEATH,),
    ),
    Mutant(
        "W11",
        BATCHING,
        "the small-job lane takes any job: a large request's items run on the lane's thread",
        "deque(job for job in self._jobs if len(job.inputs) <= small)",
        "self._jobs",
        (_BATCHING, "tests/e2e/test_small_job_lane.py"),
    ),
    Mutant(
        "W12",
        BATCHING,
        "a queued job wakes one waiting thread: the small-job lane's thread takes the wake-up of a large job",
        "sleeps on.\n            self._ready.notify_all()\n",
        "sleeps on.\n            self._ready.notify()\n",
        (_BATCHING,),
    ),
    # -- the server's rules, over real sockets: keys, CORS, drain, limits, deadlines (S) ------------------
    # (end of S)
    # -- the engine's, the batcher's and the windows' rules (E) ------------------------------------------
    # (end of E)
    # -- tokenizing bounded by work, not by pairs (T) ----------------------------------------------------
    # (end of T)
    # -- the smaller findings: metrics, errors, memory of bodies being decoded (F) -----------------------
    # (end of F)
)
