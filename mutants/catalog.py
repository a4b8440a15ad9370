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
_PINS = "tests/property/test_mutant_pins.py::"
_BATCHING = "tests/unit/test_batching.py"
_WORKER = "tests/unit/test_worker.py"
_WORKER_DEATH = "tests/unit/test_worker_death.py"
_QUEUE_WAIT = "tests/unit/test_queue_wait.py"
_LONG_QUERY = "tests/e2e/test_long_query.py::"
_HOST = "tests/host/test_host_process.py::"
_WIRE = "tests/host/test_wire.py::"
_HOST_SERVE = "tests/cli/test_model_host_serve.py::"
_BOARD = "tests/unit/test_load_board.py::"
_METRICS_PROCESSES = "tests/unit/test_metrics_processes.py::"
_FRONT_ENDS = "tests/cli/test_api_processes.py::"
_ACTIVATION = "tests/models/test_saved_activation.py::"
_MODULAR = "tests/models/test_modular_cross_encoder.py::"
_HEADS = "tests/models/test_prefix_cache.py::"
LLM_RERANKER = "scorekit/models/llm_reranker.py"
PREFIX_CACHE = "scorekit/models/prefix_cache.py"
_LISTWISE = "tests/models/test_listwise_reranker.py::"
LISTWISE = "scorekit/models/listwise.py"
_CHECK = "tests/cli/test_check.py::"

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
        (
            _PINS + "test_Q12_a_single_reader_learns_its_client_left_alike_on_every_server",
            _REGRESSIONS + "test_Q12_disconnect_seen_alike_with_two_readers",
        ),
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
        "receive() does not start the pump: with Expect: 100-continue nothing reads after the app, so a client "
        "that leaves while the app works on the body cancels nothing",
        "        self._app_asked = True\n        self._start_pump()\n",
        "        self._app_asked = True\n",
        (
            _PINS + "test_C1_expect_continue_request_is_cancelled_when_its_client_leaves",
            _QUEUE + "test_Q14_expect_continue_waits_for_app",
        ),
    ),
    Mutant(
        "L12",
        LIFECYCLE,
        "taking a chunk does not wake the pump: a pump waiting for room waits for ever, and an app that took the "
        "chunk read ahead and works on it is never cancelled",
        '                self.buffered_bytes -= len(message["body"])\n                self._notify()\n',
        '                self.buffered_bytes -= len(message["body"])\n',
        (
            _PINS + "test_C10_an_app_that_takes_the_chunk_read_ahead_is_cancelled_when_its_client_leaves",
            _QUEUE + "test_Q11_buffer_bounded",
        ),
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
        (
            _PINS + "test_Q11_taking_a_chunk_that_leaves_the_buffer_full_lets_the_pump_read_nothing",
            _QUEUE + "test_Q11_buffer_bounded",
        ),
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
        # Removing _buffer_chunk's own _notify() alone is an equivalent mutant: _read's finally has just woken
        # everyone and nothing can wait in between (no await). So the reader's wake-up goes too, kept only for a
        # reader that leaves with nothing (Q17's case): what the pump reads then wakes nobody.
        "a chunk read from the server wakes nobody: the reader wakes the waiters only when it leaves with nothing, "
        "and buffering wakes no one, so an app task waiting behind the pump sleeps on",
        "        finally:\n"
        "            self._reading = False\n"
        "            self._notify()\n"
        '        kind = message.get("type")\n'
        '        if kind == "http.disconnect":\n'
        "            self._mark_gone(cancel=True)\n"
        '        elif kind == "http.request" and not self.body_complete:\n'
        "            self._buffer_chunk(message)\n"
        "\n"
        "    def _buffer_chunk(self, message: Message) -> None:\n"
        '        body: bytes = message.get("body", b"")\n'
        '        more_body = bool(message.get("more_body", False))\n'
        "        self.body_complete = not more_body\n"
        "        if body or not more_body:\n"
        '            self._buffer.append({"type": "http.request", "body": body, "more_body": more_body})\n'
        "            self.buffered_bytes += len(body)\n"
        "        self._notify()\n",
        "        except BaseException:\n"
        "            self._notify()\n"
        "            raise\n"
        "        finally:\n"
        "            self._reading = False\n"
        '        kind = message.get("type")\n'
        '        if kind == "http.disconnect":\n'
        "            self._mark_gone(cancel=True)\n"
        '        elif kind == "http.request" and not self.body_complete:\n'
        "            self._buffer_chunk(message)\n"
        "\n"
        "    def _buffer_chunk(self, message: Message) -> None:\n"
        '        body: bytes = message.get("body", b"")\n'
        '        more_body = bool(message.get("more_body", False))\n'
        "        self.body_complete = not more_body\n"
        "        if body or not more_body:\n"
        '            self._buffer.append({"type": "http.request", "body": body, "more_body": more_body})\n'
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
        (
            _PINS + "test_C12_without_cancel_on_disconnect_a_client_that_leaves_cancels_nothing",
            _QUEUE + "test_Q7_disconnect_stays",
            _QUEUE + "test_Q8_disconnect_wakes_every_waiter",
        ),
    ),
    Mutant(
        "L27",
        LIFECYCLE,
        "no cancel on disconnect: the app runs on after its client left",
        "                self.app_scope.cancel()\n",
        "                pass\n",
        (
            _CANCEL + "test_C1_disconnect_cancels_within_k_ticks",
            # The property draws its busy apps at random and caught this in most runs, not all (it survived one
            # full run); the scripted pin catches it every time.
            _PINS + "test_C1_expect_continue_request_is_cancelled_when_its_client_leaves",
        ),
    ),
    Mutant(
        "L28",
        LIFECYCLE,
        "marking the client gone wakes nobody: after a send error, tasks waiting in wait_disconnect() or in "
        "receive() behind the reader sleep on (a disconnect read from the server still wakes them: _read's finally)",
        "                self.app_scope.cancel()\n        self._notify()\n",
        "                self.app_scope.cancel()\n",
        (
            _PINS + "test_C7_a_send_error_wakes_the_tasks_already_waiting_for_the_disconnect",
            _QUEUE + "test_Q8_disconnect_wakes_every_waiter",
            _QUEUE + "test_Q7_disconnect_stays",
        ),
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
        (
            _PINS + "test_C3_an_app_that_answers_before_the_end_of_the_body_leaves_no_pump_behind",
            _CANCEL + "test_C3_no_orphan_tasks",
            _QUEUE + "test_Q1_single_server_waiter",
        ),
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
    Mutant(
        "L47",
        LIFECYCLE,
        "a reader cancelled in the server's receive leaves without a wake-up: the tasks waiting behind it (and the "
        "pump) wait for ever",
        "            self._reading = False\n            self._notify()\n",
        "            self._reading = False\n",
        ("tests/property/test_wakeups.py::test_Q17_a_reader_that_leaves_wakes_the_waiters",),
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
    Mutant(
        "S01",
        "scorekit/middleware/auth.py",
        "a key is checked as a substring (digests dropped, `in`): a prefix or a piece of a key passes the gate",
        "            matched |= hmac.compare_digest(digest, key)\n        return matched\n\n\n"
        "def _digest(key: bytes) -> bytes:\n    return hashlib.sha256(key).digest()\n",
        "            matched |= digest in key\n        return matched\n\n\n"
        "def _digest(key: bytes) -> bytes:\n    return key\n",
        ("tests/hardening/test_server_rules.py::test_a_near_miss_of_a_key_is_refused_on_every_route_kind",),
    ),
    Mutant(
        "S02",
        "scorekit/middleware/auth.py",
        "a token that contains a key passes (the key with a character added before or after it)",
        "            matched |= hmac.compare_digest(digest, key)\n        return matched\n\n\n"
        "def _digest(key: bytes) -> bytes:\n    return hashlib.sha256(key).digest()\n",
        "            matched |= key in digest\n        return matched\n\n\n"
        "def _digest(key: bytes) -> bytes:\n    return key\n",
        (
            "tests/hardening/test_server_rules.py::test_a_near_miss_of_a_key_is_refused_on_every_route_kind",
            "tests/e2e/test_api_keys.py::test_a_request_without_a_right_key_gets_401_and_does_no_work",
        ),
    ),
    Mutant(
        "S03",
        "scorekit/middleware/auth.py",
        "every GET passes the key gate as a harmless read: /v1/models, /openapi.json and /version need no key",
        'if scope["method"] == "OPTIONS":',
        'if scope["method"] in ("OPTIONS", "GET"):',
        ("tests/hardening/test_server_rules.py::test_every_get_route_but_the_probes_needs_the_key",),
    ),
    Mutant(
        "S04",
        "scorekit/api/routes.py",
        "/version joins the probes and answers without a key",
        '_service("/version", version, "The server\'s version.", returns=VersionResponse)',
        '_service("/version", version, "The server\'s version.", returns=VersionResponse, public=True)',
        ("tests/hardening/test_server_rules.py::test_every_get_route_but_the_probes_needs_the_key",),
    ),
    Mutant(
        "S05",
        "scorekit/cli/flags.py",
        "an indented '#' line of --api-key-file is read as a key (a retired key commented out still opens the server)",
        'if line.strip() and not line.lstrip().startswith("#")',
        'if line.strip() and not line.startswith("#")',
        ("tests/hardening/test_server_rules.py::test_an_indented_hash_line_in_the_key_file_is_a_comment",),
    ),
    Mutant(
        "S06",
        "scorekit/app.py",
        "CORS allows credentials whatever --allow-credentials says",
        "allow_credentials=settings.allow_credentials,",
        "allow_credentials=True,",
        ("tests/hardening/test_server_rules.py::test_without_allow_credentials_no_answer_allows_credentials",),
    ),
    Mutant(
        "S07",
        "scorekit/settings.py",
        "credentials are allowed by default (no --allow-credentials needed)",
        "    allow_credentials: bool = False\n",
        "    allow_credentials: bool = True\n",
        ("tests/hardening/test_server_rules.py::test_without_allow_credentials_no_answer_allows_credentials",),
    ),
    Mutant(
        "S08",
        "scorekit/middleware/drain.py",
        "while draining, a request no route takes gets the drain's 503 instead of its 404 or 405",
        "if route is not None and route.refused_while_draining:",
        "if route is None or route.refused_while_draining:",
        ("tests/hardening/test_server_rules.py::test_while_draining_a_request_no_route_takes_gets_its_404_or_405",),
    ),
    Mutant(
        "S09",
        "scorekit/middleware/drain.py",
        "the drain's cut sends its 503 to every request, one whose answer had started too",
        "if cancel.cancel_called and not started and self._drain.cutting:",
        "if cancel.cancel_called and self._drain.cutting:",
        ("tests/hardening/test_server_rules.py::test_an_answer_started_before_the_drain_deadline_gets_no_503_on_top",),
    ),
    Mutant(
        "S10",
        "scorekit/middleware/drain.py",
        "the in-flight tracker forgets an answer started once its first body chunk goes: the cut sends a 503 on top",
        'started = started or message["type"] == "http.response.start"',
        'started = message["type"] == "http.response.start"',
        ("tests/hardening/test_server_rules.py::test_an_answer_started_before_the_drain_deadline_gets_no_503_on_top",),
    ),
    Mutant(
        "S11",
        "scorekit/engine.py",
        "a request of exactly --max-queued-items inputs is refused as one that can never be queued (400)",
        "if plan.count > limit:",
        "if plan.count >= limit:",
        (
            "tests/hardening/test_server_rules.py::"
            "test_exactly_max_queued_items_inputs_are_accepted_and_one_more_is_refused",
        ),
    ),
    Mutant(
        "S12",
        BATCHING,
        "a request that fills the queue to exactly --max-queued-items is shed (503), even on an empty queue",
        "if self._queued + len(job.inputs) > self.max_queued_items:",
        "if self._queued + len(job.inputs) >= self.max_queued_items:",
        (
            "tests/hardening/test_server_rules.py::"
            "test_exactly_max_queued_items_inputs_are_accepted_and_one_more_is_refused",
        ),
    ),
    Mutant(
        "S13",
        "scorekit/api/common.py",
        "a request of exactly --max-items-per-request inputs is refused (400)",
        "    if count > limit:\n",
        "    if count >= limit:\n",
        (
            "tests/hardening/test_server_rules.py::"
            "test_exactly_max_items_per_request_inputs_are_accepted_and_one_more_is_refused",
        ),
    ),
    Mutant(
        "S14",
        "scorekit/routing.py",
        "a body that declares exactly --max-body-bytes is refused (413) before it is read",
        "int(declared) > self.max_body_bytes",
        "int(declared) >= self.max_body_bytes",
        (
            "tests/hardening/test_server_rules.py::"
            "test_a_body_of_exactly_max_body_bytes_is_accepted_and_one_byte_more_is_refused",
        ),
    ),
    Mutant(
        "S15",
        "scorekit/routing.py",
        "a body that reaches exactly --max-body-bytes as it is read is refused (413)",
        "if size > self.max_body_bytes:",
        "if size >= self.max_body_bytes:",
        (
            "tests/hardening/test_server_rules.py::"
            "test_a_body_of_exactly_max_body_bytes_is_accepted_and_one_byte_more_is_refused",
        ),
    ),
    Mutant(
        "S16",
        "scorekit/connections.py",
        "only a connection's first request head has a deadline: a kept-alive connection can dribble the next for ever",
        "if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):",
        "if self._head_timer is None and self.cycle is None:",
        ("tests/hardening/test_server_rules.py::test_a_kept_alive_connections_next_head_gets_the_header_deadline",),
    ),
    Mutant(
        "S17",
        "scorekit/middleware/auth.py",
        "the key gate takes every service route for a probe: /v1/models, /openapi.json and /version need no key",
        "return route is not None and route.public",
        "return route is not None and not route.counts_as_load",
        ("tests/hardening/test_server_rules.py::test_every_get_route_but_the_probes_needs_the_key",),
    ),
    Mutant(
        "S18",
        "scorekit/routing.py",
        'a mount prefix strips from a path that merely starts with its letters: under "/sc", "/scoring" is "oring"',
        'return path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/" or root.endswith("/"))',
        "return path.startswith(root)",
        ("tests/e2e/test_mount.py::test_a_mount_prefix_is_stripped_only_at_a_segments_end",),
    ),
    Mutant(
        "S19",
        "scorekit/routing.py",
        "the router forgets its last lookup: the metrics, the key gate, the drain gate and the router each match "
        "the request again",
        "if last is not None and last[0] == key:",
        "if False:",
        ("tests/unit/test_route_matching.py",),
    ),
    # (end of S)
    # -- the engine's, the batcher's and the windows' rules (E) ------------------------------------------
    Mutant(
        "E01",
        "scorekit/engine.py",
        "a request that raises (a model error, a refusal while tokenizing) keeps its admission: after "
        "max_concurrent_requests failures every request is a 503",
        "        admitted.add(1)\n        try:\n            yield\n        finally:\n            admitted.add(-1)\n",
        "        admitted.add(1)\n        yield\n        admitted.add(-1)\n",
        ("tests/unit/test_engine_rules.py::test_E1_admission_is_given_back_however_a_request_ends",),
    ),
    Mutant(
        "E02",
        "scorekit/engine.py",
        "a cancelled request (its client left) keeps its admission: errors give it back, a cancellation does not",
        "        try:\n            yield\n        finally:\n            admitted.add(-1)\n",
        "        try:\n            yield\n        except Exception:\n            admitted.add(-1)\n            raise\n"
        "        else:\n            admitted.add(-1)\n",
        ("tests/unit/test_engine_rules.py::test_E1_admission_is_given_back_however_a_request_ends",),
    ),
    Mutant(
        "E03",
        "scorekit/engine.py",
        "the failure reason is tested for ModelFailure first: a dead worker's requests count as model_error",
        '        elif isinstance(error, WorkerDied):\n            self._observer.failed("worker_died")\n'
        '        elif isinstance(error, ModelFailure):\n            self._observer.failed("model_error")\n',
        '        elif isinstance(error, ModelFailure):\n            self._observer.failed("model_error")\n'
        '        elif isinstance(error, WorkerDied):\n            self._observer.failed("worker_died")\n',
        ("tests/unit/test_engine_rules.py::test_E2_a_dead_workers_requests_are_counted_as_worker_died",),
    ),
    Mutant(
        "E04",
        WORKER,
        "a dying worker fails its requests with a plain ModelFailure: /metrics counts them as model_error",
        'failure = WorkerDied(f"The model worker died',
        'failure = ModelFailure(f"The model worker died',
        ("tests/unit/test_engine_rules.py::test_E2_a_dead_workers_requests_are_counted_as_worker_died",),
    ),
    Mutant(
        "E05",
        BATCHING,
        "an input longer than max_batch_tokens is refused by every cut, even alone: its request waits for ever",
        "(batch and cost * (len(batch) + 1) > limit)",
        "(cost * (len(batch) + 1) > limit)",
        ("tests/unit/test_batcher_rules.py::test_E3_an_input_longer_than_the_token_limit_runs_in_a_batch_of_its_own",),
    ),
    Mutant(
        "E06",
        BATCHING,
        "the fill pass takes the jobs with the fewest inputs, not the fewest left: a nearly done job waits",
        "key=lambda j: len(j._pending)",
        "key=lambda j: len(j.inputs)",
        ("tests/unit/test_batcher_rules.py::test_E4_fill_goes_to_the_request_with_the_fewest_items_left",),
    ),
    Mutant(
        "E07",
        BATCHING,
        "the small-job lane's edge is off by one: a request of exactly --small-job-lane inputs is not the lane's",
        "deque(job for job in self._jobs if len(job.inputs) <= small)",
        "deque(job for job in self._jobs if len(job.inputs) < small)",
        (
            "tests/unit/test_batcher_rules.py::"
            "test_E5_a_request_of_exactly_the_lanes_size_rides_the_lane_and_one_more_does_not",
        ),
    ),
    Mutant(
        "E08",
        BATCHING,
        "the cost fit forgets nothing: batches are sized by an average over every batch since start-up",
        "self._sums = [self.memory * old + add for",
        "self._sums = [old + add for",
        ("tests/unit/test_batcher_rules.py::test_E6_the_cost_fit_follows_the_recent_batches",),
    ),
    Mutant(
        "E09",
        BATCHING,
        "the budget gives way to the smallest job as if the batch were empty: the batch grows past its budget "
        "and the job is split anyway",
        "count = len(batch) + len(job._pending)",
        "count = len(job._pending)",
        ("tests/unit/test_batcher_rules.py::test_E7_the_budget_gives_way_only_to_complete_the_smallest_request",),
    ),
    Mutant(
        "E10",
        "scorekit/models/windows.py",
        "the chunk overlap is not clamped to half a window: an overlap of a window never moves on, a large one "
        "multiplies the windows",
        "step = room - min(chunking.overlap, room // 2)",
        "step = room - chunking.overlap",
        (
            "tests/unit/test_windows_rules.py::test_E8_neighbouring_windows_share_at_most_half_a_window",
            "tests/unit/test_windows_rules.py::test_E8_an_overlap_of_a_window_or_more_still_moves_on",
        ),
    ),
    Mutant(
        "E11",
        "scorekit/api/common.py",
        "a content type with parameters (application/json; charset=utf-8) is refused",
        '(request.header("content-type") or "").split(";")[0].strip().lower()',
        '(request.header("content-type") or "").strip().lower()',
        ("tests/e2e/test_content_types.py::test_E9_a_json_content_type_with_parameters_or_in_capitals_is_accepted",),
    ),
    Mutant(
        "E12",
        "scorekit/api/common.py",
        "the media type is compared case-sensitively: Application/JSON is refused",
        '(request.header("content-type") or "").split(";")[0].strip().lower()',
        '(request.header("content-type") or "").split(";")[0].strip()',
        ("tests/e2e/test_content_types.py::test_E9_a_json_content_type_with_parameters_or_in_capitals_is_accepted",),
    ),
    Mutant(
        "E13",
        "scorekit/api/common.py",
        "any media type that starts with application/json is taken (application/jsonl)",
        'if media_type != "application/json":',
        'if not media_type.startswith("application/json"):',
        ("tests/e2e/test_content_types.py::test_E9_any_other_media_type_is_refused",),
    ),
    Mutant(
        "E14",
        "scorekit/engine.py",
        "a capability is resolved from the wrong protocol: a pair scorer is taken for a label scorer, and asking it "
        "for label scores fails (500) instead of being refused (404)",
        "self._labels = backend if isinstance(backend, LabelScorer) else None",
        "self._labels = backend if isinstance(backend, PairScorer) else None",
        ("tests/unit/test_engine_rules.py::test_E13_a_task_the_backend_cannot_do_is_refused_before_any_work",),
    ),
    Mutant(
        "E15",
        "scorekit/model_host.py",
        "the engine ignores the backend's batch-cost trait: an LLM reranker's batches are cut by a cost fit that "
        "does not hold for it",
        "batch_efficiency=config.batch_efficiency if backend.batch_cost_follows_tokens else None,",
        "batch_efficiency=config.batch_efficiency,",
        (_BATCHING + "::test_batches_are_cut_by_the_cost_fit_except_an_llm_rerankers",),
    ),
    Mutant(
        "E16",
        "scorekit/app.py",
        "a model host process that loaded another kind or length of model than the server plans for is taken as "
        "long as the name matches: the server tokenizes for one model and another runs",
        "    if hosted != card:\n",
        "    if hosted.name != card.name:\n",
        ("tests/unit/test_weightless.py::test_a_host_whose_model_is_not_the_one_the_server_plans_for_is_refused",),
    ),
    Mutant(
        "E17",
        "scorekit/models/loaded.py",
        "the server's weightless copy of a hosted model runs a forward on the meta device instead of refusing it",
        "    model.register_forward_pre_hook(refuse)\n",
        "",
        ("tests/unit/test_weightless.py::test_the_weightless_copy_has_the_models_card_and_plans_and_no_weights",),
    ),
    # (end of E)
    # -- tokenizing bounded by work, not by pairs (T) ----------------------------------------------------
    Mutant(
        "T01",
        "scorekit/models/truncation.py",
        "a truncated pair's query is tokenized whole: a 1.6-million-word query costs its length, not what fits",
        "cap = None if limits.keep is None else max(limits.max_length, longest) + 1",
        "cap = None",
        (_LONG_QUERY + "test_an_answered_long_query_costs_what_a_512_token_query_does_plus_reading_it",),
    ),
    Mutant(
        "T02",
        "scorekit/models/tokens.py",
        "the checkpoint runs once, before the first unit of work: an abandoned request tokenizes to its end",
        "if not self._started or self._pending + units > CHUNK_CHARS:",
        "if not self._started:",
        (_LONG_QUERY + "test_a_long_query_abandoned_while_tokenizing_stops_within_one_unit_of_work",),
    ),
    Mutant(
        "T03",
        "scorekit/models/truncation.py",
        "a query that fills the model's length but for the special tokens is cut into empty windows",
        "if rest >= max_length:",
        "if rest > max_length:",
        (_LONG_QUERY + "test_a_query_that_leaves_no_room_for_a_document_token_is_refused_naming_it",),
    ),
    Mutant(
        "T04",
        "scorekit/models/pairs.py",
        "a query that leaves no room for a document token is blamed on the document, the longer text",
        "        if part is not None:\n            return (query if part == 0 else document,)\n",
        "",
        (_LONG_QUERY + "test_a_query_that_leaves_no_room_for_a_document_token_is_refused_naming_it",),
    ),
    Mutant(
        "T05",
        "scorekit/engine.py",
        "a tokenizing thread's time is not recorded: a request abandoned mid-tokenizing costs invisibly",
        "            with _timed(observer.tokenized):\n                return tokenize(checkpoint)\n",
        "            return tokenize(checkpoint)\n",
        (_LONG_QUERY + "test_a_long_query_abandoned_while_tokenizing_stops_within_one_unit_of_work",),
    ),
    Mutant(
        "T06",
        "scorekit/models/tokens.py",
        "a long text capped from its end is read from its start: left truncation keeps the wrong tokens",
        "        if not head:\n            pieces.reverse()\n",
        "",
        ("tests/models/test_tokens.py::test_a_capped_text_keeps_the_tokens_of_its_kept_end",),
    ),
    Mutant(
        "T07",
        "scorekit/models/llm_reranker.py",
        "an LLM reranker joins the whole of a truncated long query into every document's prompt",
        "if options.chunking is not None or request_limits.keep is not None:",
        "if options.chunking is not None:",
        (
            "tests/models/test_llm_reranker.py::"
            "test_a_long_query_is_read_only_as_deep_as_its_prompts_keep_and_they_are_the_same",
        ),
    ),
    Mutant(
        "T08",
        "scorekit/models/llm_reranker.py",
        "with windows, an LLM reranker joins a query longer than the model into every prompt before refusing it",
        "            if options.chunking is not None and not all(whole for _, whole in shortened):",
        "            if False:",
        (
            "tests/models/test_llm_reranker.py::"
            "test_with_windows_a_query_longer_than_the_model_is_refused_without_reading_it_all",
        ),
    ),
    Mutant(
        "T09",
        "scorekit/models/causal_lm.py",
        "a causal LM tokenizes a long query (or item) whole, though a prompt keeps only the model's length of it",
        "read = self._tokens.content(texts, meter, cap=self.max_length)",
        "read = self._tokens.content(texts, meter)",
        ("tests/models/test_backends.py::test_causal_lm_reads_a_long_query_only_as_deep_as_a_prompt_keeps",),
    ),
    Mutant(
        "T10",
        "scorekit/models/truncation.py",
        "a truncated pair's query is capped above the model's length only, not above the longest document: "
        "read shorter than a long document, it loses the longest-first odd token",
        "cap = None if limits.keep is None else max(limits.max_length, longest) + 1",
        "cap = None if limits.keep is None else limits.max_length + 1",
        ("tests/models/test_tokens.py::test_a_capped_query_keeps_the_longest_first_odd_token_of_the_whole",),
    ),
    Mutant(
        "T11",
        "scorekit/models/tokens.py",
        "work that fills a step exactly is cut into two steps (the unit's boundary off by one)",
        "if not self._started or self._pending + units > CHUNK_CHARS:",
        "if not self._started or self._pending + units >= CHUNK_CHARS:",
        ("tests/models/test_tokens.py::test_a_step_of_exactly_one_unit_is_one_step_and_one_more_unit_is_two",),
    ),
    # (end of T)
    # -- the smaller findings: metrics, errors, memory of bodies being decoded (F) -----------------------
    Mutant(
        "F01",
        "scorekit/middleware/metrics.py",
        "/metrics counts a request that sent nothing through it as 499 at once, before the lifecycle's 400 to a "
        "broken body goes out",
        "owner: _Finishing | None = scope.get(LIFECYCLE_KEY)",
        "owner: _Finishing | None = None",
        ("tests/hardening/test_findings.py::test_metrics_count_the_400_sent_to_a_malformed_body_under_granian",),
    ),
    Mutant(
        "F02",
        LIFECYCLE,
        "the lifecycle does not note the status it forwards: an answer sent after the app returned counts as 499",
        '            self.sent_status = message["status"]\n',
        "",
        ("tests/hardening/test_findings.py::test_metrics_count_the_400_sent_to_a_malformed_body_under_granian",),
    ),
    Mutant(
        "F03",
        "scorekit/api/invocations.py",
        "/invocations lets its endpoint's typed errors through to the router, which names the route: \"the "
        '/invocations API" instead of the API the body was recognised as',
        "    except ScorekitError as error:\n",
        "    except LookupError as error:\n",
        ("tests/hardening/test_findings.py::test_invocations_names_the_api_the_model_lacks",),
    ),
    Mutant(
        "F04",
        "scorekit/api/common.py",
        "/invocations refuses a body that is not JSON in /generative_scoring's words, not /score's",
        "    return await _decode(request, partial(_chosen, choose), parsed_in_handler=False)",
        "    return await _decode(request, partial(_chosen, choose), parsed_in_handler=True)",
        ("tests/hardening/test_findings.py::test_invocations_errors_are_those_of_the_path_the_body_is_for",),
    ),
    Mutant(
        "F05",
        "scorekit/api/openapi.py",
        "/openapi.json keeps one method per path: /ping's POST replaces its GET",
        "        paths.setdefault(entry.path, {})[route.method.lower()] = operation",
        "        paths[entry.path] = {route.method.lower(): operation}",
        ("tests/hardening/test_findings.py::test_every_route_of_the_table_is_in_openapi",),
    ),
    Mutant(
        "F06",
        "scorekit/api/decoding.py",
        "every body is let into its decoding thread at once: forty 15 MB bodies are decoded side by side",
        "        if not self._waiting and self._fits(size):\n",
        "        if True:\n",
        ("tests/unit/test_decode_budget.py",),
    ),
    Mutant(
        "F07",
        "scorekit/api/decoding.py",
        "a body larger than the bound waits for room that never comes (it should decode alone)",
        "        return self.held == 0 or self.held + size <= self.limit",
        "        return self.held + size <= self.limit",
        ("tests/unit/test_decode_budget.py::test_a_body_over_the_bound_decodes_alone",),
    ),
    Mutant(
        "F08",
        "scorekit/api/decoding.py",
        "a small body passes the large one waiting ahead of it, which can wait for ever",
        "        if not self._waiting and self._fits(size):\n",
        "        if self._fits(size):\n",
        ("tests/unit/test_decode_budget.py::test_waiters_are_let_in_in_arrival_order",),
    ),
    Mutant(
        "F09",
        "scorekit/api/decoding.py",
        "a waiter that leaves (its client gone) while first in line holds back the bodies behind it",
        "                    self._let_in()  # it may have been first in line, holding the others back\n",
        "",
        ("tests/unit/test_decode_budget.py::test_a_cancelled_waiter_gives_its_place_up",),
    ),
    Mutant(
        "F10",
        "scorekit/api/common.py",
        "decode ignores the server's budget: large bodies go to their threads unbounded",
        "        budget: DecodeBudget | None = request.state.decoding if request.state is not None else None\n",
        "        budget: DecodeBudget | None = None\n",
        ("tests/unit/test_decode_budget.py::test_decode_keeps_the_bytes_inside_msgspec_under_the_bound",),
    ),
    Mutant(
        "F11",
        "scorekit/models/files.py",
        "a hub name missing from the cache is taken as cached while the hub cannot be reached: the load goes on "
        'to "it has no config.json"',
        "                if isinstance(try_to_load_from_cache(self.name, prefix + filename), str):\n",
        "                if True:\n",
        ("tests/cli/test_model_not_found.py::test_a_name_neither_a_folder_nor_reachable_is_one_line_at_once",),
    ),
    Mutant(
        "F12",
        "scorekit/models/files.py",
        "HF_HUB_OFFLINE is not looked at: the one line blames the network, which was never asked",
        "        if constants.is_offline_mode():\n",
        "        if False:\n",
        ("tests/cli/test_model_not_found.py::test_with_hf_hub_offline_the_hub_is_not_asked",),
    ),
    Mutant(
        "F13",
        "scorekit/models/files.py",
        "a cached hub name is still fetched while the hub cannot be reached: every file waits out the retries",
        "        local = self.is_local or Source.hub_unreachable() is not None\n",
        "        local = self.is_local\n",
        (
            "tests/cli/test_model_not_found.py::"
            "test_a_cached_model_is_served_from_the_cache_without_waiting_for_the_hub",
        ),
    ),
    Mutant(
        "F14",
        "scorekit/logs.py",
        "huggingface_hub keeps its own handler: each hub warning is printed twice, once without the format",
        "        hub.removeHandler(handler)\n",
        "        pass\n",
        ("tests/cli/test_model_not_found.py::test_a_hub_warning_is_logged_once_in_the_one_format",),
    ),
    Mutant(
        "F15",
        "scorekit/api/common.py",
        "an endpoint reached through /invocations decodes the body again, which /invocations decoded to pick it",
        "    if isinstance(request.decoded, kind):\n        return request.decoded\n",
        "",
        ("tests/unit/test_decode_once.py::test_invocations_decodes_the_body_once",),
    ),
    Mutant(
        "F16",
        "scorekit/api/invocations.py",
        "/invocations hands its endpoint the request without the body it decoded: the endpoint decodes it again",
        "return await endpoint(replace(request, decoded=body))",
        "return await endpoint(request)",
        ("tests/unit/test_decode_once.py::test_invocations_hands_its_endpoint_the_body_it_decoded",),
    ),
    Mutant(
        "F17",
        "scorekit/api/errors.py",
        "an over-long input on /score's query side is named without its index, as /rerank's one query is",
        'return f"{self.query}[{index}]" if self.query_is_list else self.query',
        "return self.query",
        ("tests/unit/test_error_table.py::test_an_over_long_input_is_named_as_its_route_spells_it",),
    ),
    Mutant(
        "F18",
        "scorekit/models/base.py",
        "a backend's forward no longer enters inference mode: a caller outside the worker builds an autograd graph",
        "        with torch.inference_mode():\n            return forward(*args, **kwargs)\n",
        "        return forward(*args, **kwargs)\n",
        ("tests/models/test_backends.py::test_a_forward_builds_no_autograd_graph_whoever_calls_it",),
    ),
    # (end of F)
    # -- start-up and configuration: what Settings, the flags and load_models refuse (C) ----------------
    Mutant(
        "C01",
        "scorekit/settings.py",
        "a runtime is checked against the device and dtype but not the kind given: --runtime onnx --model-kind"
        " causal-lm passes the flags and fails only once the model loads",
        "runtime_error(self.runtime, kind=self.kind, device=self.device, dtype=self.dtype)",
        "runtime_error(self.runtime, kind=None, device=self.device, dtype=self.dtype)",
        (
            "tests/cli/test_runtime_flags.py::test_what_an_onnx_runtime_cannot_serve_is_refused_while_parsing",
            "tests/unit/test_settings.py::test_a_model_spec_refuses_bad_values_and_so_does_the_one_model_shorthand",
        ),
    ),
    Mutant(
        "C02",
        "scorekit/settings.py",
        "Settings with no model are accepted: the app has no default model, and every request fails",
        "if not isinstance(models, tuple) or not models or not all(",
        "if not isinstance(models, tuple) or not all(",
        ("tests/unit/test_settings.py::test_settings_refuse_bad_values",),
    ),
    Mutant(
        "C03",
        "scorekit/app.py",
        "a model loaded before the lifespan (by scorekit serve, or an embedding app) skips the settings' checks: a"
        " bi-encoder chunking long documents by default is served, and refuses every such request",
        'weights=spec.host == "thread")\n        check_long_documents(',
        'weights=spec.host == "thread")\n            check_long_documents(',
        ("tests/unit/test_load_models.py::test_a_model_loaded_already_is_checked_like_one_it_loads",),
    ),
    Mutant(
        "C04",
        "scorekit/cli/serve.py",
        "a runtime that cannot serve the kind a model turned out to be is answered as a failed load (exit 1), not"
        " as the usage error it is (exit 2)",
        "    except UnfitRuntime as exc:\n        usage_error(",
        "    except KeyError as exc:\n        usage_error(",
        ("tests/cli/test_runtime_flags.py::test_a_detected_causal_lm_is_refused_before_it_loads",),
    ),
    Mutant(
        "C05",
        "scorekit/deploy/options.py",
        "--replicas beside --max-replicas is taken: Ray autoscales, and the fixed count is silently ignored",
        '        if max_replicas is not None and "replicas" in given:\n',
        "        if False:\n",
        ("tests/cli/test_ray_flags.py::test_bad_combinations_are_one_line",),
    ),
    # (end of C)
    # -- the model host process: its wire, the host and its client (H) -----------------------------------
    Mutant(
        "H01",
        "scorekit/host/process.py",
        "the host forgets an aborted job but leaves its items queued: the items of a client that left still run",
        "                        self.local.cancel(job)\n                case wire.Expire",
        "                        pass\n                case wire.Expire",
        (_HOST + "test_an_aborted_queued_job_never_runs",),
    ),
    Mutant(
        "H02",
        "scorekit/host/wire.py",
        "a shared prefix is rebuilt once per input, not once per prefix: inputs that shared one no longer do, so an"
        " LLM reranker runs each prompt's prefix again",
        "None if item.prefix < 0 else prefixes[item.prefix],",
        "None if item.prefix < 0 else SharedPrefix(message.prefixes[item.prefix]),",
        (
            _WIRE + "test_inputs_of_one_prefix_share_one_object_on_the_host",
            _WIRE + "test_inputs_come_back_as_they_went",
        ),
    ),
    Mutant(
        "H03",
        "scorekit/host/client.py",
        "a dead host turns the health false but leaves its outstanding jobs waiting: their requests hang",
        "        self._fail_outstanding(self._death)\n",
        "",
        (_HOST + "test_a_killed_host_fails_every_outstanding_job_at_once",),
    ),
    Mutant(
        "H04",
        "scorekit/host/client.py",
        "the client's queue limit is off by one: a job that fills the queue exactly is refused",
        "if queued + len(job.inputs) > limit:",
        "if queued + len(job.inputs) >= limit:",
        (_HOST + "test_the_client_refuses_past_max_queued_items",),
    ),
    Mutant(
        "H05",
        "scorekit/host/process.py",
        "the host keeps waiting once its front end has gone: a host process outlives the server that started it",
        "        finally:  # a message it cannot read ends the host too, never leaves it waiting\n"
        "            ended.set()\n",
        "        finally:\n            pass\n",
        (_HOST + "test_the_host_exits_when_its_front_end_goes_away",),
    ),
    Mutant(
        "H06",
        "scorekit/app.py",
        "the metrics' queue gauges ask the model host for a snapshot: every /metrics scrape waits on a round trip to"
        " the host on the event loop, and on a stopped host up to the stats timeout",
        "items, tokens = engine.queue()",
        "items, tokens = engine.snapshot().queued_items, engine.snapshot().queued_tokens",
        ("tests/e2e/test_model_host.py::test_metrics_never_wait_on_the_host",),
    ),
    Mutant(
        "H07",
        "scorekit/serving.py",
        "a dead model host process leaves `scorekit serve` answering 503 for ever: it never drains nor exits, so no"
        " supervisor restarts it",
        "                self.handle_exit(signal.SIGTERM, None)\n",
        "                pass\n",
        (_HOST_SERVE + "test_a_host_that_dies_drains_the_server_which_exits_with_its_own_status",),
    ),
    Mutant(
        "H08",
        "scorekit/serving.py",
        "a server whose model host process died exits 0, as after an orderly shutdown: a supervisor sees no failure",
        "        return HOST_DIED_EXIT\n",
        "        return 0\n",
        (_HOST_SERVE + "test_a_host_that_dies_drains_the_server_which_exits_with_its_own_status",),
    ),
    Mutant(
        "H09",
        "scorekit/cli/serve.py",
        "`scorekit serve` leaves its model host processes to the lifespan: a host that cannot load is uvicorn's"
        " lifespan failure and a traceback, not the command's one line",
        "        app.start_hosts()",
        "        pass",
        (_HOST_SERVE + "test_a_host_that_cannot_load_its_weights_is_one_line_and_exit_1",),
    ),
    Mutant(
        "H10",
        "scorekit/cli/serve.py",
        "a host's start error is told as the client's exception type before the host's own line",
        "own=isinstance(exc, HostStartError)",
        "own=False",
        (_HOST_SERVE + "test_a_host_that_cannot_load_its_weights_is_one_line_and_exit_1",),
    ),
    Mutant(
        "H11",
        "scorekit/settings.py",
        "ModelSpec takes any host: a misspelt one serves in process without a word, as if it were thread",
        "        if self.host not in MODEL_HOSTS:\n",
        "        if False:\n",
        ("tests/unit/test_settings.py::test_a_model_spec_refuses_bad_values_and_so_does_the_one_model_shorthand",),
    ),
    Mutant(
        "H12",
        "scorekit/cli/parser.py",
        "--model-host process passes under --ray, whose replicas run their model in process: the flag is ignored",
        'if args.ray and args.model_host == "process":',
        'if args.ray and args.model_host == "processes":',
        ("tests/cli/test_model_host_flag.py::test_process_under_ray_is_refused",),
    ),
    # (end of H)
    # -- the load board read everywhere: admission, /metrics over processes, the drain (K) -----------------
    Mutant(
        "K01",
        "scorekit/engine.py",
        "admission checks max_concurrent_requests against this front end's own count: with N front ends the model"
        " takes N times its limit",
        "if (active := admitted.value) >= self.config.max_concurrent_requests:",
        "if (active := admitted.here) >= self.config.max_concurrent_requests:",
        (_BOARD + "test_the_admission_limit_is_the_whole_servers",),
    ),
    Mutant(
        "K02",
        "scorekit/metrics.py",
        "a scrape over processes answers without the multiprocess files: no counter or histogram at all",
        "            MultiProcessCollector(self._scraped, path=str(processes))  # type: ignore[no-untyped-call]\n",
        "",
        (_METRICS_PROCESSES + "test_a_scrape_sums_every_process_and_reads_the_live_gauges_once",),
    ),
    Mutant(
        "K03",
        "scorekit/metrics.py",
        "the multiprocess files are read into the registry this process counts in: each series twice, its own share"
        " beside the sum",
        "            self._scraped = CollectorRegistry()\n",
        "            self._scraped = self.registry\n",
        (_METRICS_PROCESSES + "test_a_scrape_sums_every_process_and_reads_the_live_gauges_once",),
    ),
    Mutant(
        "K04",
        "scorekit/metrics.py",
        "metrics over processes take a prometheus-client that does not write there: a scrape answers one front"
        " end's share as the server's",
        "            _check_multiprocess(processes)\n",
        "            pass\n",
        (_METRICS_PROCESSES + "test_metrics_over_processes_refuse_a_prometheus_client_that_is_not_writing_there",),
    ),
    Mutant(
        "K05",
        "scorekit/serving.py",
        "a draining front end waits for every front end's requests, its own long finished, until the deadline cuts",
        "        admitted = self._scorekit.load.routed_here\n",
        "        admitted = self._scorekit.load.routed\n",
        (_BOARD + "test_a_drain_waits_for_its_own_requests_not_another_front_ends",),
    ),
    Mutant(
        "K06",
        "scorekit/load.py",
        "clearing a row outside the board clears another front end's: -1 is the last row",
        "        start = _checked(row) * COLUMNS",
        "        start = row * COLUMNS",
        (_BOARD + "test_clear_zeroes_one_front_ends_row_only",),
    ),
    Mutant(
        "K07",
        "scorekit/load.py",
        "a counter name may fill its whole slot, with no NUL after it",
        "if not 0 < len(encoded) < NAME_BYTES",
        "if not 0 < len(encoded) <= NAME_BYTES",
        (_BOARD + "test_counter_names_take_1_to_NAME_BYTES_less_one_bytes",),
    ),
    Mutant(
        "K08",
        "scorekit/load.py",
        "a front end attaches any row: one past the board counts outside it",
        "        return cls(path, _checked(row))",
        "        return cls(path, row)",
        (_BOARD + "test_attach_takes_rows_0_to_ROWS_less_one",),
    ),
    # (end of K)
    # -- several front-end processes: the supervisor, its flag, the host they join (P) -----------------------
    Mutant(
        "P01",
        "scorekit/cli/supervisor.py",
        "a dead front end's row is left on the board: /load counts its dead requests forever",
        "                board.clear(front_end.row)\n",
        "",
        (_FRONT_ENDS + "test_a_front_end_that_dies_is_replaced_and_its_load_cleared",),
    ),
    Mutant(
        "P02",
        "scorekit/cli/supervisor.py",
        "a front end that dies while serving is not replaced: the server serves on with one fewer",
        "                self.front_ends[index] = self._spawn(front_end.row)\n",
        "",
        (_FRONT_ENDS + "test_a_front_end_that_dies_is_replaced_and_its_load_cleared",),
    ),
    Mutant(
        "P03",
        "scorekit/cli/supervisor.py",
        "the supervisor keeps its signal to itself: the front ends never drain and SIGTERM never ends the server",
        "                self._signal_front_ends()\n",
        "                pass\n",
        (_FRONT_ENDS + "test_sigterm_drains_every_front_end_then_stops_the_host",),
    ),
    Mutant(
        "P04",
        "scorekit/cli/supervisor.py",
        "a dead host ends the server with status 0, as if it had been asked to stop",
        "            return _error(host_died, HOST_DIED_EXIT)\n        logger.info(",
        "            return _error(host_died, 0)\n        logger.info(",
        (_FRONT_ENDS + "test_a_dead_host_fails_every_front_end_s_requests_and_the_server_exits_3",),
    ),
    Mutant(
        "P05",
        "scorekit/host/process.py",
        "a host tells every batch to its owner (the supervisor, which keeps no metrics): /metrics counts none",
        "            return self._joined[0] if self._joined else self.owner",
        "            return self.owner",
        ("tests/host/test_joined_front_ends.py::test_reports_go_to_the_oldest_front_end_and_move_on_when_it_leaves",),
    ),
    Mutant(
        "P06",
        "scorekit/host/client.py",
        "a front end's queue limit counts its own items only: N front ends queue N times the limit",
        "            queued = self._items.value",
        "            queued = self._items.here",
        ("tests/host/test_joined_front_ends.py::test_the_queue_books_on_a_board_count_every_front_end",),
    ),
    Mutant(
        "P07",
        "scorekit/cli/parser.py",
        "--api-processes 2 leaves the models in process: each front end would load its own weights",
        '        args.model_host = "process"\n',
        "",
        ("tests/cli/test_api_processes_flag.py::test_one_by_default_and_more_hosts_every_model_in_a_process",),
    ),
    Mutant(
        "P08",
        "scorekit/cli/parser.py",
        "auto beside a GPU is one front end: the request work stays in the one interpreter",
        "        args.api_processes = 1 if on_cpu else min(8, max(2, (os.cpu_count() or 1) // 4))",
        "        args.api_processes = 1",
        ("tests/cli/test_api_processes_flag.py::test_auto_is_one_on_a_cpu_and_a_quarter_of_the_cores_beside_a_gpu",),
    ),
    Mutant(
        "P09",
        "scorekit/cli/parser.py",
        "--api-processes passes under --ray, whose replicas are processes of Ray's: the flag is ignored",
        "    if args.ray and args.api_processes != 1:",
        "    if args.ray and args.api_processes > 64:",
        ("tests/cli/test_api_processes_flag.py::test_several_under_ray_are_refused",),
    ),
    Mutant(
        "P10",
        "scorekit/connections.py",
        "the front ends' sockets share the port without SO_REUSEPORT: the second cannot bind",
        "        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n",
        "        pass\n",
        (_FRONT_ENDS + "test_both_front_ends_serve_the_scores_of_the_model",),
    ),
    Mutant(
        "P11",
        "scorekit/cli/table.py",
        "--api-processes takes one more front end than the load board has rows",
        "        whole_or_auto(FRONT_ENDS),",
        "        whole_or_auto(FRONT_ENDS + 1),",
        ("tests/cli/test_api_processes_flag.py::test_the_limit_is_the_board_s_rows",),
    ),
    # (end of P)
    # -- reranker families scored as their recipes say (R) ---------------------------------------------------
    Mutant(
        "R01",
        "scorekit/models/activations.py",
        "the pre-v4 place of a saved activation is not read: such a model scores with sigmoid",
        '        path = getattr(config, "sbert_ce_default_activation_function", None)\n',
        "        path = None\n",
        (_ACTIVATION + "test_the_saved_activation_scores_as_cross_encoder_predict",),
    ),
    Mutant(
        "R02",
        "scorekit/models/activations.py",
        "a path outside torch is imported without trust_remote_code: a config runs code that sentence-transformers"
        " would not",
        '    if not (path.startswith("torch.") or trust_remote_code):',
        '    if not (path.startswith("torch.") or True):',
        (_ACTIVATION + "test_a_path_outside_torch_is_sigmoid_without_trust_as_sentence_transformers_says",),
    ),
    Mutant(
        "R03",
        "scorekit/models/windows.py",
        "a long document's best window is the one with the highest logit: under a saved GELU another scores better",
        "key=lambda i: (scored[first + i], logits[first + i])",
        "key=lambda i: logits[first + i]",
        (_ACTIVATION + "test_the_best_window_is_the_one_that_scores_best",),
    ),
    Mutant(
        "R04",
        "scorekit/models/activations.py",
        "a saved activation other than sigmoid or identity is taken for sigmoid",
        "    return Activation(path, _imported(path, name))",
        "    return Activation(DEFAULT, sigmoid)",
        (_ACTIVATION + "test_the_saved_activation_scores_as_cross_encoder_predict",),
    ),
    Mutant(
        "R05",
        "scorekit/models/bi_encoder.py",
        "a bi-encoder scores a long document by its first window, not its best",
        "                best = int(torch.argmax(cosines))  # the first of equal maxima\n",
        "                best = 0\n",
        ("tests/e2e/test_long_documents.py::test_a_bi_encoder_scores_a_long_document_by_its_best_window",),
    ),
    Mutant(
        "R06",
        "scorekit/models/bi_encoder.py",
        "a bi-encoder's chunked usage counts the query alone, not the windows it embedded",
        "                tokens += sum(item.cost for item in inputs[starts[row] : starts[row + 1]])\n",
        "                pass\n",
        ("tests/e2e/test_long_documents.py::test_a_bi_encoder_scores_a_long_document_by_its_best_window",),
    ),
    Mutant(
        "R07",
        "scorekit/models/rerank_template.py",
        "an mxbai-rerank-v2 folder gets no preset from its name: a Qwen2 has none by its type, so it is refused",
        '            return PRESETS[preset], f"preset {preset} (by its name)"\n',
        "            pass\n",
        ("tests/models/test_mxbai_reranker.py::test_the_folder_s_name_makes_it_an_llm_reranker_with_the_mxbai_preset",),
    ),
    Mutant(
        "R08",
        "scorekit/models/rerank_template.py",
        "a request's instruction fills the slot bare: mxbai-rerank-v2's 'instruction: ...' line is lost",
        'self.instruction_format.replace("{instruction}", text) if text else ""',
        "text",
        ("tests/models/test_mxbai_reranker.py::test_an_instruction_is_its_own_line_before_the_query",),
    ),
    Mutant(
        "R09",
        "scorekit/models/activations.py",
        "config_sentence_transformers.json's activation (sentence-transformers 6 saves it there) is not read",
        '    path = sentence_transformers.get("activation_fn") if isinstance(sentence_transformers, dict) else None\n',
        "    path = None\n",
        (_ACTIVATION + "test_a_cross_encoder_saved_by_sentence_transformers_6_keeps_its_activation",),
    ),
    Mutant(
        "R10",
        "scorekit/models/__init__.py",
        "a modular CrossEncoder is taken for what its backbone's config says, a bi-encoder, and refused",
        "    if modular_transformer(source) is not None:  # a backbone's architectures",
        "    if False:  # a backbone's architectures",
        (_MODULAR + "test_a_modular_cross_encoder_scores_as_predict",),
    ),
    Mutant(
        "R11",
        "scorekit/models/st_head.py",
        "a Dense module's residual is left out of its output",
        "        features[self.target] = out if self.residual is None else out + self.residual(x)\n",
        "        features[self.target] = out\n",
        (_MODULAR + "test_a_modular_cross_encoder_scores_as_predict",),
    ),
    Mutant(
        "R12",
        "scorekit/models/st_head.py",
        "the head's Pooling pools by the mean whatever its saved mode",
        '        features[_EMBEDDING] = pool(self.mode, features["token_embeddings"], features["attention_mask"])\n',
        '        features[_EMBEDDING] = pool("mean", features["token_embeddings"], features["attention_mask"])\n',
        (_MODULAR + "test_a_modular_cross_encoder_scores_as_predict",),
    ),
    Mutant(
        "R13",
        "scorekit/models/st_head.py",
        "a head module scorekit cannot run is skipped: the scores come without it",
        "        else:  # a module scorekit cannot run\n            raise ValueError(",
        "        else:  # a module scorekit cannot run\n            continue\n            raise ValueError(",
        (_MODULAR + "test_a_head_module_it_cannot_run_and_another_runtime_are_one_line",),
    ),
    Mutant(
        "R14",
        "scorekit/models/rerank_template.py",
        "a template's instruction_format without its slot is taken: the request's instruction is dropped",
        'if self.instruction_format.count("{instruction}") != 1:',
        'if self.instruction_format.count("{instruction}") > 1:',
        ("tests/models/test_mxbai_reranker.py::test_an_instruction_format_needs_its_slot_exactly_once",),
    ),
    Mutant(
        "R15",
        "scorekit/models/cross_encoder.py",
        "a modular CrossEncoder is handed to --runtime onnx, which has no export of its head",
        '            if runtime.name != "torch":\n',
        "            if False:\n",
        (_MODULAR + "test_a_head_module_it_cannot_run_and_another_runtime_are_one_line",),
    ),
    # (end of R)
    # -- listwise rerankers (jina-reranker-v3) --------------------------------------------------------------
    Mutant(
        "J01",
        LISTWISE,
        "a window holds 65 documents: past the recipe's 64, the context the model was trained on",
        "len(packed[-1]) == WINDOW_DOCUMENTS or",
        "len(packed[-1]) == WINDOW_DOCUMENTS + 1 or",
        (_LISTWISE + "test_64_documents_share_one_context_and_the_65th_opens_a_window",),
    ),
    Mutant(
        "J02",
        LISTWISE,
        "windows are joined by a plain mean of their query embeddings, not weighted by each one's best score",
        "if float(weights.sum()) > 0 else",
        "if False else",
        (_LISTWISE + "test_64_documents_share_one_context_and_the_65th_opens_a_window",),
    ),
    Mutant(
        "J03",
        LISTWISE,
        "markers are removed once each, in turn: one hidden inside another survives and adds a place to read",
        "    while EMBED_TOKEN in text or QUERY_TOKEN in text:\n",
        "    for _ in range(1):\n",
        (_LISTWISE + "test_markers_in_a_text_are_removed_however_they_are_nested",),
    ),
    Mutant(
        "J04",
        LISTWISE,
        "a window's weight is its worst document's (1 + cosine) / 2, not its best's",
        "(1 + _cosines(output[:-1].double(), output[-1].double())).max() / 2",
        "(1 + _cosines(output[:-1].double(), output[-1].double())).min() / 2",
        (_LISTWISE + "test_64_documents_share_one_context_and_the_65th_opens_a_window",),
    ),
    Mutant(
        "J05",
        LISTWISE,
        "a window whose prompt, tokenized whole, is longer than its parts said is not split: it cannot be read",
        "len(passages) > 1:",
        "len(passages) > 99:",
        (_LISTWISE + "test_a_window_longer_than_its_estimate_is_split_until_each_fits",),
    ),
    Mutant(
        "J06",
        "scorekit/models/files.py",
        "a JinaForRanking folder is taken for a bi-encoder (its architectures name no known suffix)",
        'if "JinaForRanking" in architectures:',
        'if "JinaForRanking" == architectures:',
        (_LISTWISE + "test_the_architecture_makes_it_a_listwise_reranker_without_its_code",),
    ),
    Mutant(
        "J07",
        LISTWISE,
        "a document too long for its window is cut even when the request asked for no truncation",
        "                if request_limits.keep is None:\n",
        "                if False:\n",
        (_LISTWISE + "test_a_document_too_long_is_refused_or_cut_as_asked",),
    ),
    # (end of J)
    # -- the template head's key/value cache, kept across requests (issue 33) (V) -----------------------------
    Mutant(
        "V01",
        LLM_RERANKER,
        "the prompts' rests after a kept head are placed as if the head were not there (no position offset)",
        "offset = skip + before.sum(dim=1, keepdim=True)[rows]",
        "offset = before.sum(dim=1, keepdim=True)[rows]",
        (_HEADS + "test_scores_with_the_head_cache_are_those_of_plain_forwards",),
    ),
    Mutant(
        "V02",
        LLM_RERANKER,
        "a request's shared prefix after a kept head starts at position 0",
        "self._run(ids, over_head, before, skip, cache, use_cache=True)",
        "self._run(ids, over_head, before, 0, cache, use_cache=True)",
        (_HEADS + "test_scores_with_the_head_cache_are_those_of_plain_forwards",),
    ),
    Mutant(
        "V03",
        LLM_RERANKER,
        "the attention mask hides the kept head from the tokens after it",
        "over_head = torch.ones(len(requests), skip, dtype=torch.long)",
        "over_head = torch.zeros(len(requests), skip, dtype=torch.long)",
        (_HEADS + "test_scores_with_the_head_cache_are_those_of_plain_forwards",),
    ),
    Mutant(
        "V04",
        LLM_RERANKER,
        "a prompt is given the longest head it outlasts without its tokens being compared: an instruction's "
        "prompt gets the default instruction's head",
        "len(ids) > len(head) and ids[: len(head)] == head",
        "len(ids) > len(head)",
        (_HEADS + "test_scores_with_the_head_cache_are_those_of_plain_forwards",),
    ),
    Mutant(
        "V05",
        LLM_RERANKER,
        "the shortest head is tried first: a request without an instruction runs the template's instruction again",
        "sorted(heads.values(), key=len, reverse=True)",
        "sorted(heads.values(), key=len)",
        (_HEADS + "test_the_head_runs_once_across_requests",),
    ),
    Mutant(
        "V06",
        PREFIX_CACHE,
        "the store keeps every head it is given: no bound on its entries or bytes",
        "            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:\n",
        "            while False:\n",
        (
            _HEADS + "test_the_store_drops_the_least_recently_used_head_past_its_entries",
            _HEADS + "test_past_the_bound_heads_are_dropped_and_the_scores_stay_plain",
        ),
    ),
    Mutant(
        "V07",
        PREFIX_CACHE,
        "the store hands out the cache it keeps, which the forward then extends",
        "return _copy(entry.cache, rows, self._config)",
        "return entry.cache",
        (
            _HEADS + "test_the_store_hands_out_a_new_cache_that_a_forward_may_extend",
            _HEADS + "test_scores_with_the_head_cache_are_those_of_plain_forwards",
        ),
    ),
    Mutant(
        "V08",
        PREFIX_CACHE,
        "a head over the byte bound is kept, and so drops every other head (and then itself)",
        "        if entry.nbytes > self.max_bytes:\n            return\n",
        "",
        (_HEADS + "test_the_store_keeps_to_its_bytes_and_never_keeps_a_head_bigger_than_them",),
    ),
    # (end of V)
    # -- embedding options: Matryoshka dimensions, saved prompts, Cohere's /v2/embed and its types (M) ------------
    Mutant(
        "M01",
        "scorekit/models/embed_options.py",
        "dimensions one past the model's width is answered (a vector of the width) instead of refused",
        "if not 1 <= size <= self.width:",
        "if not 1 <= size <= self.width + 1:",
        ("tests/e2e/test_embedding_options.py::test_a_config_that_says_nothing_allows_1_to_the_width",),
    ),
    Mutant(
        "M02",
        "scorekit/models/embed_options.py",
        "dimensions 0 is answered (empty vectors) instead of refused",
        "if not 1 <= size <= self.width:",
        "if not 0 <= size <= self.width:",
        ("tests/e2e/test_embedding_options.py::test_a_config_that_says_nothing_allows_1_to_the_width",),
    ),
    Mutant(
        "M03",
        "scorekit/models/embed_options.py",
        "the full width is refused by a model whose config lists its Matryoshka sizes or says it has none",
        "        if size == self.width:\n            return size\n",
        "",
        (
            "tests/e2e/test_embedding_options.py::test_a_config_that_lists_its_sizes_allows_those_and_the_width",
            "tests/e2e/test_embedding_options.py::test_a_config_that_says_it_was_not_trained_allows_only_the_width",
        ),
    ),
    Mutant(
        "M04",
        "scorekit/models/embed_options.py",
        "the config's matryoshka_dimensions are not read as a limit: any size is cut",
        "if self.sizes is not None and size not in self.sizes:",
        "if False:",
        ("tests/e2e/test_embedding_options.py::test_a_config_that_lists_its_sizes_allows_those_and_the_width",),
    ),
    Mutant(
        "M05",
        "scorekit/models/embed_options.py",
        "a config's is_matryoshka: false is ignored: a model that says it has no Matryoshka sizes is cut",
        "if self.sizes is None and self.trained is False:",
        "if False:",
        ("tests/e2e/test_embedding_options.py::test_a_config_that_says_it_was_not_trained_allows_only_the_width",),
    ),
    Mutant(
        "M06",
        "scorekit/models/bi_encoder.py",
        "the vector is normalized and then cut (truncate_dim without normalize_embeddings): not a unit vector",
        "    pooled = torch.stack(outputs if size is None else [output[:size] for output in outputs])\n"
        "    return functional.normalize(pooled, p=2, dim=1, out=pooled) if normalize else pooled\n",
        "    pooled = torch.stack(outputs)\n"
        "    pooled = functional.normalize(pooled, p=2, dim=1, out=pooled) if normalize else pooled\n"
        "    return pooled[:, :size]\n",
        (
            "tests/e2e/test_embedding_options.py::test_dimensions_are_sentence_transformers_truncate_dim_then_normalized",
        ),
    ),
    Mutant(
        "M07",
        "scorekit/models/bi_encoder.py",
        "the prompt is not put before the texts: every prompt, the default one too, is ignored",
        "prompted = [prompt + text for text in distinct]",
        "prompted = distinct",
        ("tests/e2e/test_embedding_options.py::test_prompts_are_those_sentence_transformers_puts_before_each_text",),
    ),
    Mutant(
        "M08",
        "scorekit/models/embed_options.py",
        "the model's default_prompt_name is ignored when the request names no prompt",
        'return self.prompts[self.default] if self.default is not None else ""',
        'return ""',
        ("tests/e2e/test_embedding_options.py::test_prompts_are_those_sentence_transformers_puts_before_each_text",),
    ),
    Mutant(
        "M09",
        "scorekit/models/embed_options.py",
        "a prompt_name the model never saved embeds the bare text instead of a 400 naming prompt_name",
        '        if asked.if_saved:\n            return ""\n',
        '        if True:\n            return ""\n',
        ("tests/e2e/test_embedding_options.py::test_an_unknown_prompt_name_is_refused_by_name",),
    ),
    Mutant(
        "M10",
        "scorekit/models/embed_options.py",
        "an input_type the model has no prompt for falls back to its default prompt (encode_query never does)",
        '        if asked.if_saved:\n            return ""\n',
        "        if asked.if_saved:\n            return self.text(None)\n",
        ("tests/e2e/test_embedding_options.py::test_prompts_are_those_sentence_transformers_puts_before_each_text",),
    ),
    Mutant(
        "M11",
        "scorekit/models/embed_options.py",
        'only saved prompts are known: prompt_name "query" is a 400 on a model without prompts',
        "prompts = {**ALWAYS_KNOWN, **saved}",
        "prompts = saved",
        ("tests/e2e/test_embedding_options.py::test_an_unknown_prompt_name_is_refused_by_name",),
    ),
    Mutant(
        "M12",
        "scorekit/models/bi_encoder.py",
        "include_prompt: false is ignored: the prompt's tokens are pooled",
        "skipped = SharedPrefix(prompt_length(self._tokenizer, prompt)) if prompt and not self.pools_prompt else None",
        "skipped = None",
        (
            "tests/e2e/test_embedding_options.py::test_the_prompt_is_left_out_of_pooling_when_the_pooling_says_so",
            "tests/e2e/test_embedding_options.py::test_tei_normalize_false_cuts_the_pooled_vector",
        ),
    ),
    Mutant(
        "M13",
        "scorekit/models/embed_options.py",
        "the prompt's length counts its trailing [SEP]: one token of the text is left out of pooling too",
        "return len(ids) - 1 if ids and ids[-1] in tokenizer.all_special_ids else len(ids)",
        "return len(ids)",
        ("tests/e2e/test_embedding_options.py::test_the_prompt_is_left_out_of_pooling_when_the_pooling_says_so",),
    ),
    Mutant(
        "M14",
        "scorekit/models/pooling.py",
        "cls pooling takes position 0 whatever the mask: the prompt's [CLS] when the prompt is left out",
        "return hidden[rows, mask.argmax(dim=1)]",
        "return hidden[:, 0]",
        ("tests/e2e/test_embedding_options.py::test_the_prompt_is_left_out_of_pooling_when_the_pooling_says_so",),
    ),
    Mutant(
        "M15",
        "scorekit/models/pooling.py",
        "lasttoken pooling counts the kept tokens as the last one's place: wrong once a prompt is masked out",
        "return hidden[rows, mask.shape[1] - 1 - mask.flip(1).argmax(dim=1)]",
        "return hidden[rows, mask.sum(dim=1) - 1]",
        ("tests/e2e/test_embedding_options.py::test_the_prompt_is_left_out_of_pooling_when_the_pooling_says_so",),
    ),
    Mutant(
        "M16",
        "scorekit/api/encodings.py",
        "int8 is uint8 less 127: values in -127..128, out of int8",
        'shifted = buckets - 128 if kind == "int8" else buckets',
        'shifted = buckets - 127 if kind == "int8" else buckets',
        (
            "tests/e2e/test_cohere_embed.py::test_the_sdk_gets_every_embedding_type_as_sentence_transformers_computes_it",
            "tests/e2e/test_cohere_embed.py::test_int8_and_uint8_follow_the_rule_written_out",
        ),
    ),
    Mutant(
        "M17",
        "scorekit/api/encodings.py",
        "the buckets are rounded, not floored (quantize_embeddings floors)",
        "np.floor((values - (-largest)) / steps)",
        "np.round((values - (-largest)) / steps)",
        (
            "tests/e2e/test_cohere_embed.py::test_the_sdk_gets_every_embedding_type_as_sentence_transformers_computes_it",
            "tests/e2e/test_cohere_embed.py::test_int8_and_uint8_follow_the_rule_written_out",
        ),
    ),
    Mutant(
        "M18",
        "scorekit/api/encodings.py",
        "int8 and uint8 are calibrated on the whole request, so a text's answer depends on the other texts",
        "largest = np.abs(values).max(axis=-1, keepdims=True)",
        "largest = np.abs(values).max()",
        (
            "tests/e2e/test_cohere_embed.py::test_the_sdk_gets_every_embedding_type_as_sentence_transformers_computes_it",
        ),
    ),
    Mutant(
        "M19",
        "scorekit/api/encodings.py",
        "binary is answered unsigned, as ubinary",
        "(packed.astype(np.int16) - 128 if signed else packed)",
        "(packed.astype(np.int16) if signed else packed)",
        (
            "tests/e2e/test_cohere_embed.py::test_the_sdk_gets_every_embedding_type_as_sentence_transformers_computes_it",
            "tests/e2e/test_cohere_embed.py::test_binary_packs_the_signs_eight_to_a_byte_highest_bit_first",
        ),
    ),
    Mutant(
        "M20",
        "scorekit/api/encodings.py",
        "the bits are packed lowest first",
        "np.packbits(values > 0, axis=-1)",
        'np.packbits(values > 0, axis=-1, bitorder="little")',
        ("tests/e2e/test_cohere_embed.py::test_binary_packs_the_signs_eight_to_a_byte_highest_bit_first",),
    ),
    Mutant(
        "M21",
        "scorekit/api/cohere_embed.py",
        "truncate START cuts the end, as END does",
        '"left" if body.truncate == "START" else "right"',
        '"right"',
        (
            "tests/e2e/test_cohere_embed.py::test_truncate_cuts_the_end_by_default_the_start_when_asked_and_none_refuses",
        ),
    ),
    Mutant(
        "M22",
        "scorekit/api/cohere_embed.py",
        "truncate NONE cuts an over-long text instead of refusing it",
        'None if body.truncate == "NONE" else -1',
        "-1",
        (
            "tests/e2e/test_cohere_embed.py::test_truncate_cuts_the_end_by_default_the_start_when_asked_and_none_refuses",
        ),
    ),
    Mutant(
        "M23",
        "scorekit/api/cohere_embed.py",
        'search_document picks a "passage" prompt, which encode_document never reads',
        '"search_document": "document",',
        '"search_document": "passage",',
        ("tests/e2e/test_embedding_options.py::test_prompts_are_those_sentence_transformers_puts_before_each_text",),
    ),
    Mutant(
        "M24",
        "scorekit/api/cohere_embed.py",
        "an output_dimension refusal names dimensions, a field the Cohere body does not have",
        'Dimensions(body.output_dimension, "output_dimension")',
        "Dimensions(body.output_dimension)",
        ("tests/e2e/test_embedding_options.py::test_a_config_that_says_nothing_allows_1_to_the_width",),
    ),
    Mutant(
        "M25",
        "scorekit/api/cohere_embed.py",
        "billed input tokens count the texts, not their tokens",
        "CohereBilledUnits(input_tokens=result.prompt_tokens)",
        "CohereBilledUnits(input_tokens=len(texts))",
        (
            "tests/e2e/test_cohere_embed.py::test_the_sdk_gets_every_embedding_type_as_sentence_transformers_computes_it",
            "tests/e2e/test_embedding_options.py::test_usage_counts_the_prompt_tokens",
        ),
    ),
    Mutant(
        "M26",
        "scorekit/api/cohere_embed.py",
        "/v2/embed takes any number of texts: --max-items-per-request is not checked",
        "    check_count(state, len(texts), field)\n",
        "",
        ("tests/e2e/test_cohere_embed.py::test_max_items_per_request_counts_texts",),
    ),
    Mutant(
        "M27",
        "scorekit/api/routes.py",
        "/v2/embed is not counted in /load (so a drain does not wait for it)",
        "        api=COHERE_EMBED_API,\n",
        "        api=COHERE_EMBED_API,\n        counts_as_load=False,\n",
        (
            "tests/e2e/test_cohere_embed.py::"
            "test_a_large_v2_embed_is_batched_counted_in_load_and_cancelled_when_its_client_leaves",
        ),
    ),
    Mutant(
        "M28",
        "scorekit/api/embed.py",
        "TEI's /embed ignores dimensions",
        "dimensions=None if body.dimensions is None else Dimensions(body.dimensions),",
        "dimensions=None,",
        (
            "tests/e2e/test_embedding_options.py::test_dimensions_are_sentence_transformers_truncate_dim_then_normalized",
        ),
    ),
    Mutant(
        "M29",
        "scorekit/api/embed.py",
        "TEI's /embed ignores prompt_name",
        "prompt=None if body.prompt_name is None else Prompt(body.prompt_name),",
        "prompt=None,",
        ("tests/e2e/test_embedding_options.py::test_prompts_are_those_sentence_transformers_puts_before_each_text",),
    ),
    Mutant(
        "M30",
        "scorekit/api/embeddings.py",
        "/v1/embeddings ignores prompt_name",
        "prompt=None if body.prompt_name is None else Prompt(body.prompt_name),",
        "prompt=None,",
        ("tests/e2e/test_embedding_options.py::test_prompts_are_those_sentence_transformers_puts_before_each_text",),
    ),
    # (end of M)
    # -- scorekit check and the start-up description (issue 33, item 6) ---------------------------------------
    Mutant(
        "D01",
        "scorekit/cli/check.py",
        "scorekit check compares the tolerance the wrong way: agreeing probes are reported, differing ones pass",
        "    return [row for row in rows if not row.difference <= TOLERANCE]",
        "    return [row for row in rows if not row.difference >= TOLERANCE]",
        (
            _CHECK + "test_the_tolerance_is_inclusive_and_a_nan_is_apart",
            _CHECK + "test_a_divergence_is_one_line_per_probe_and_exit_1",
        ),
    ),
    Mutant(
        "D02",
        "scorekit/cli/check.py",
        "scorekit check says the differences on stderr but exits 0, so a script or CI step never sees them",
        "    return 1 if differ else 0",
        "    return 0",
        (_CHECK + "test_a_divergence_is_one_line_per_probe_and_exit_1",),
    ),
    Mutant(
        "D03",
        "scorekit/models/__init__.py",
        "a Sentence-Transformers bi-encoder is said to be one by its backbone's architectures, not by its modules.json",
        'if kind in (None, "bi-encoder") and isinstance(modules, list) and modules:',
        "if kind is None and isinstance(modules, list) and modules:",
        (_CHECK + "test_each_family_s_check_passes[bi-encoder]",),
    ),
    Mutant(
        "D04",
        "scorekit/models/files.py",
        "architectures of no family (a masked LM with no modules.json) are served as a bi-encoder, a guess",
        'if any(name.endswith("Model") for name in architectures):',
        "if True:",
        (_CHECK + "test_architectures_of_no_kind_are_refused",),
    ),
    Mutant(
        "D05",
        "scorekit/models/description.py",
        "the start-up log gives the model's own length as where a --max-model-len limit came from",
        "if backend.max_length != loading.own_length:",
        "if False:",
        (_CHECK + "test_the_lines_are_the_start_up_log_s",),
    ),
    Mutant(
        "D06",
        "scorekit/models/activations.py",
        "the start-up log no longer says which activation a cross-encoder saved, nor where it was read",
        'return chosen if chosen.said else replace(chosen, said=f"its saved activation {chosen.path} ({where})")',
        "return chosen",
        (_ACTIVATION + "test_a_trusted_path_is_imported_and_one_that_cannot_be_is_a_load_error",),
    ),
    Mutant(
        "D07",
        "scorekit/cli/reference.py",
        "the LLM reranker's reference leaves out the BOS its template asks for: each bge-reranker-v2-gemma check fails",
        "ids = [self._tokenizer.bos_token_id] if template.bos else []",
        "ids = []",
        (_CHECK + "test_each_family_s_check_passes[bge-reranker-v2-gemma]",),
    ),
    Mutant(
        "D08",
        "scorekit/cli/probes.py",
        "scorekit check sends each pair alone only: a prefix shared by a request's prompts, or a listwise context of"
        " several documents, is never checked",
        "requests = [(query, (document,)) for query, document in PAIRS] + [ONE_QUERY]",
        "requests = [(query, (document,)) for query, document in PAIRS]",
        (_CHECK + "test_the_check_as_a_process_prints_how_it_serves_and_agrees",),
    ),
    # (end of D)
)
