import ArgumentParser
import DocumentEngine
import Foundation
import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// `docfs retention [STORE] [POLICY]`, `docfs retention [STORE] --standard|--current-only`
struct Retention: DocfsCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show or change a store's retention policy.",
        usage: """
            docfs retention [STORE]
            docfs retention [STORE] POLICY
            docfs retention [STORE] --standard | --current-only
            """,
        discussion: """
            Every store has a retention policy: which old versions of its documents are kept, \
            and for how long deleted documents are. `docfs gc`, and `docfs` and the mount in the \
            background (at most once an hour), drop what it does not keep. The current version \
            of every document and unresolved conflicts are always kept. A new store has the \
            standard policy.

            Without POLICY, prints the store's policy in words, then its text form on a line \
            starting "policy: ". With POLICY (or --standard, --current-only), sets it for every \
            process that uses the store, and prints it the same way.

            POLICY is `standard`, `current-only`, or comma-separated rules:
              last=N        always keep the newest N versions of each document (at least 1;
                            default 1)
              all=D         keep every version at most D old (default 0)
              hourly=D      then one version per hour for D; also daily=D, weekly=D and
                            monthly=D (30-day spans); every=D:for=D for any interval.
                            These apply one after another, in the order written
              deleted=D     remove a deleted document D after its deletion (default 30d)
            A duration D is 0, forever, or numbers with units w, d, h, m, s, ms, us or ns \
            (90s, 12h, 30d, 1d12h).

            The standard policy is last=10,all=1h,hourly=1d,daily=30d,weekly=forever,deleted=30d: \
            the newest 10 versions, every version of the last hour, then one per hour for a \
            day, one per day for 30 days, and one per week after that; deleted documents go \
            30 days after deletion. current-only keeps only the current version, and removes \
            deleted documents at the next collection.

            A lone argument is a STORE when it contains a "/" or ends in ".docstore" (no policy \
            does), and otherwise a POLICY for the default store.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help: ArgumentHelp(
            "An optional STORE, then an optional POLICY (see USAGE).", valueName: "store-and-policy"))
    var arguments: [String] = []

    @Flag(help: "Set the standard policy (same as POLICY `standard`).")
    var standard = false

    @Flag(help: "Keep only current versions (same as POLICY `current-only`).")
    var currentOnly = false

    /// The store, and the policy text to set (nil: show the policy).
    func resolved() throws -> (store: String?, policy: String?) {
        let shorthand = standard ? "standard" : currentOnly ? "current-only" : nil
        if let shorthand {
            guard arguments.count <= 1 else {
                throw ValidationError(
                    "--\(shorthand) sets the policy; give no POLICY with it (expected [STORE])")
            }
            return (arguments.first, shorthand)
        }
        let (store, policy) = try Positionals.optionalStoreAndName(arguments, what: "POLICY")
        return (store, policy)
    }

    func validate() throws {
        if standard, currentOnly { throw ValidationError("give one of --standard and --current-only") }
        _ = try resolved()
    }

    func run() async throws {
        let logger = global.bootstrap()
        let (storeArgument, text) = try resolved()
        // Read the text before opening the store, so that a typo costs nothing.
        var policy: RetentionPolicy?
        if let text {
            do throws(RetentionPolicy.ParseError) {
                policy = try RetentionPolicy(parsing: text)
            } catch {
                throw Failure(error.description)
            }
        }
        let store = try StoreLocation(storeArgument).open(logger: logger)
        if let policy {
            logger.info("setting the retention policy", metadata: ["policy": "\(policy)"])
            try store.setRetentionPolicy(policy)
        }
        for line in Self.describe(try store.retentionPolicy()) { print(line) }
    }

    /// The policy in words, one line per rule, then `policy: ` and its text form.
    static func describe(_ policy: RetentionPolicy) -> [String] {
        var lines: [String] = []
        lines.append(
            policy.keepLast == 1
                ? "keep the current version of each document"
                : "keep the newest \(policy.keepLast) versions of each document")

        // The rules by age, which apply one after another: `keepAll`, then the tiers up to the
        // first that lasts forever (later ones never apply).
        var agesCovered = false  // whether an earlier rule by age precedes the next one
        var lastsForever = false
        if policy.keepAll > .zero {
            lines.append(
                isForever(policy.keepAll)
                    ? "keep every version, forever"
                    : "keep every version of the last \(words(policy.keepAll))")
            agesCovered = true
            lastsForever = isForever(policy.keepAll)
        }
        for tier in policy.tiers where !lastsForever {
            let what = tier.interval == .zero ? "every version" : "one \(per(tier.interval))"
            let span = tier.span
            if agesCovered {
                lines.append(span.map { "then \(what) for \(words($0))" } ?? "then \(what) after that")
            } else {
                lines.append(span.map { "keep \(what) for the last \(words($0))" } ?? "keep \(what), forever")
            }
            agesCovered = true
            lastsForever = span == nil
        }
        if !lastsForever {
            lines.append(agesCovered ? "older versions go" : "no other versions are kept")
        }

        let deleted = policy.deletedDocumentsExpireAfter
        if deleted == .zero {
            lines.append("deleted documents go at the next collection")
        } else if isForever(deleted) {
            lines.append("deleted documents are kept forever")
        } else {
            lines.append("deleted documents go \(words(deleted)) after deletion")
        }
        lines.append("policy: \(policy)")
        return lines
    }

    /// Whether `duration` is ``RetentionPolicy/forever`` (or longer).
    static func isForever(_ duration: Duration) -> Bool { duration >= RetentionPolicy.forever }

    /// Units for durations in words, largest first.
    private static let units: [(name: String, nanoseconds: Int64)] = [
        ("week", 604_800_000_000_000), ("day", 86_400_000_000_000), ("hour", 3_600_000_000_000),
        ("minute", 60_000_000_000), ("second", 1_000_000_000), ("millisecond", 1_000_000),
        ("microsecond", 1_000), ("nanosecond", 1),
    ]

    /// `duration` in whole nanoseconds, within 0...Int64.max.
    private static func nanoseconds(_ duration: Duration) -> Int64 {
        guard duration > .zero else { return 0 }
        guard duration < RetentionPolicy.forever else { return .max }
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    /// `1 hour`, `30 days`, `2 weeks`, `1 day 12 hours`, `forever`. Weeks only when exact, as
    /// in the text form: `30 days` reads better than `4 weeks 2 days`.
    static func words(_ duration: Duration) -> String {
        if isForever(duration) { return "forever" }
        let ns = nanoseconds(duration)
        if ns == 0 { return "no time" }
        if ns % units[0].nanoseconds == 0 {
            return Format.count(Int(ns / units[0].nanoseconds), units[0].name)
        }
        var rest = ns
        var parts: [String] = []
        for unit in units.dropFirst() where rest >= unit.nanoseconds {
            parts.append(Format.count(Int(rest / unit.nanoseconds), unit.name))
            rest %= unit.nanoseconds
        }
        return parts.joined(separator: " ")
    }

    /// `per hour`, `per day`, `per 6 hours`, `per 30 days`.
    static func per(_ interval: Duration) -> String {
        let ns = nanoseconds(interval)
        if let unit = units.first(where: { $0.nanoseconds == ns }) { return "per \(unit.name)" }
        return "per \(words(interval))"
    }
}

/// What `docfs` runs after a command that changed a store: the store's own retention policy,
/// unless some process applied it within the last hour, so that history thins itself without
/// being asked. A failure never fails the command that succeeded; it is logged.
func collectGarbageInBackground(_ store: any DocumentStore, logger: Logger) {
    // The command's own output first, should the collection take a while.
    fflush(nil)  // every output stream: standard output, without naming the global
    do {
        if let report = try store.collectGarbageIfDue(every: .seconds(3600)) {
            logger.debug(
                "collected garbage in the background",
                metadata: [
                    "versionsRemoved": "\(report.versionsRemoved)",
                    "documentsRemoved": "\(report.documentsRemoved)",
                    "chunksRemoved": "\(report.chunksRemoved)", "bytesFreed": "\(report.bytesFreed)",
                ])
        } else {
            logger.debug("garbage collection is not due")
        }
    } catch {
        logger.notice(
            "background garbage collection failed", metadata: ["error": "\(Failure.describe(error))"])
    }
}
