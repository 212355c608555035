"""The episode check: the trainer's own episode log against the env's record.

The step ledger checks what crosses the boundary. The returns a trainer
reports come from its episode log instead (SB3's ``monitor.csv``, Gymnasium's
``RecordEpisodeStatistics``), which is computed on the trainer's side and can
be wrong on its own: Gymnasium 1.1 to 1.3's vector ``RecordEpisodeStatistics``
under SAME_STEP drops each later episode's first reward and step. The env-side
ledger holds every reward exactly, so each episode's true return and length
can be derived from it and checked against the log.

``check_episodes(env_dir, log)`` returns an ``EpisodeReport``; the command is
``stepledger episodes ENV_DIR LOG``. ``EpisodeLogTap`` saves what a Gymnasium
vector ``RecordEpisodeStatistics`` reports, with each episode's env index.
See docs/EPISODES.md.

One module a job: ``episodes.derive`` derives the episodes from the env-side
ledger, ``episodes.logs`` reads the trainer's logs, ``episodes.match`` pairs
them and builds the report, whose lines ``stepledger.wording`` words;
``EpisodeLogTap`` lives in ``stepledger.episode_tap``, next to the other
trainer-side wrappers. Every name is importable from here, as before.

Episodes from the ledger. An episode is a reset event and the step events
after it, up to and including the first step with terminated or truncated;
its length is the number of those steps, its return the sum of their rewards
(read from the raw reward bits, summed in float64). Only episodes that ended
that way are compared. Not compared: the last episode of a stream if it was
still running when the ledger ended (a trainer logs an episode when it ends,
so the log cannot have it either), episodes cut off by a reset before they
ended (trainers' logs skip them too), and steps outside any episode. The
report counts each kind. Ledgers are read chunk by chunk; only one summary
row per episode is kept in memory.

Tolerance. Lengths must match exactly. A logged return ``r`` matches an
episode with rewards ``x_i`` when ``|r - R| <= rtol * sum(|x_i|) + atol``
(``rtol = atol = 1e-5`` by default, atol once per episode) for R either the
float64 sum of the recorded rewards or their running float32 sum (the sum SB3's
VecMonitor keeps, exactly). This absorbs float32 against float64 rewards and
summation, and SB3's Monitor rounding returns to 6 decimals. No absolute term
grows with the length, so that a dropped reward still shows in a long episode;
a dropped reward within the tolerance (a reward of 0, say) cannot show.
"""

from stepledger.report.episodes.tap import EpisodeLogTap
from stepledger.report.episodes.derive import EPISODE_CHUNK, RecordedEpisodes, recorded_episodes
from stepledger.report.episodes.logs import (LOG_FORMAT, LOG_FORMAT_VERSION, MAX_LOG_CSV_BYTES, MAX_LOG_EPISODES, MAX_LOG_MEMBER_BYTES, EpisodeLog,
                   read_episode_log)
from stepledger.report.episodes.match import ATOL, MATCH_MODES, RTOL, EpisodeDifference, EpisodeReport, check_episodes

__all__ = ["ATOL", "EPISODE_CHUNK", "LOG_FORMAT", "LOG_FORMAT_VERSION", "MATCH_MODES", "MAX_LOG_CSV_BYTES",
           "MAX_LOG_EPISODES", "MAX_LOG_MEMBER_BYTES", "RTOL", "EpisodeDifference", "EpisodeLog", "EpisodeLogTap", "EpisodeReport",
           "RecordedEpisodes", "check_episodes", "read_episode_log", "recorded_episodes"]
