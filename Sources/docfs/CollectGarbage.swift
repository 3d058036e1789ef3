import ArgumentParser
import DocumentEngine
import Foundation

/// `docfs gc [STORE] [--keep-last N] [--keep-for DURATION]`
struct CollectGarbage: DocfsCommand {
    static let configuration = CommandConfiguration(
        commandName: "gc",
        abstract: "Drop old versions and the content nothing needs any more.",
        discussion: """
            Without options, applies the store's own retention policy (see `docfs retention`, \
            which shows and changes it). `docfs` and the mount also apply it by themselves, at \
            most once an hour; `docfs gc` applies it now.

            With --keep-last or --keep-for, applies that rule once instead, leaving the store's \
            policy as it is: a version is dropped only when it is beyond the newest --keep-last \
            of its document (default 50) AND older than --keep-for (default 30d); deleted \
            documents go once they have been deleted for longer than --keep-for.

            Either way the current version and unresolved conflicts are always kept, then the \
            chunks no kept version references are removed and their space given back.

            DURATION is a number with a unit, s, m, h, d or w, or several (1d12h); 0 means none.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: "The store (default: the default store).")
    var store: String?

    @Option(
        help: ArgumentHelp(
            "Instead of the store's policy: versions to keep per document, at least 1 (default: 50).",
            valueName: "n"))
    var keepLast: Int?

    @Option(
        help: ArgumentHelp(
            "Instead of the store's policy: how long to keep versions, e.g. 30d or 12h (default: 30d).",
            valueName: "duration"))
    var keepFor: DurationArgument?

    func validate() throws {
        // RetentionPolicy would quietly raise 0 to 1; say so instead.
        if let keepLast, keepLast < 1 {
            throw ValidationError("--keep-last must be at least 1 (the current version)")
        }
    }

    /// The one-off rule of --keep-last and --keep-for, or nil for the store's own policy.
    var oneOffPolicy: RetentionPolicy? {
        guard keepLast != nil || keepFor != nil else { return nil }
        let defaults = RetentionPolicy()
        return RetentionPolicy(
            keepLast: keepLast ?? defaults.keepLast, keepFor: keepFor?.duration ?? defaults.keepAll)
    }

    func run() async throws {
        let logger = global.bootstrap()
        let store = try StoreLocation(self.store).open(logger: logger)
        let report: CollectionReport
        if let policy = oneOffPolicy {
            logger.info("collecting garbage with a one-off policy", metadata: ["policy": "\(policy)"])
            report = try store.collectGarbage(policy)
        } else {
            let policy = try store.retentionPolicy()
            logger.info("collecting garbage with the store's policy", metadata: ["policy": "\(policy)"])
            report = try store.collectGarbage(protecting: [])
        }
        print(
            "removed \(Format.count(report.versionsRemoved, "version")), "
                + "\(Format.count(report.documentsRemoved, "deleted document")) and "
                + "\(Format.count(report.chunksRemoved, "chunk")) (\(report.bytesFreed) bytes)")
    }
}
