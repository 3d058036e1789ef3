import ArgumentParser
import DocumentEngine
import Foundation

/// `docfs gc [STORE] [--keep-last N] [--keep-for DURATION]`
struct CollectGarbage: DocfsCommand {
    static let configuration = CommandConfiguration(
        commandName: "gc",
        abstract: "Drop old versions and the content nothing needs any more.",
        discussion: """
            A version is dropped only when it is beyond the newest --keep-last of its document \
            AND older than --keep-for; the current version and unresolved conflicts are always \
            kept. Deleted documents go once they have been deleted for longer than --keep-for. \
            Then the chunks no kept version references are removed.

            DURATION is a number with a unit, s, m, h, d or w, or several (1d12h); 0 means none.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: "The store (default: the default store).")
    var store: String?

    @Option(help: ArgumentHelp("Versions to keep per document, at least 1.", valueName: "n"))
    var keepLast = RetentionPolicy().keepLast

    @Option(
        help: ArgumentHelp(
            "How long to keep versions, e.g. 30d or 12h (default: 30d).", valueName: "duration"))
    var keepFor: DurationArgument?

    func validate() throws {
        // RetentionPolicy would quietly raise 0 to 1; say so instead.
        if keepLast < 1 { throw ValidationError("--keep-last must be at least 1 (the current version)") }
    }

    func run() async throws {
        let logger = global.bootstrap()
        let store = try StoreLocation(self.store).open(logger: logger)
        let policy = RetentionPolicy(
            keepLast: keepLast, keepFor: keepFor?.duration ?? RetentionPolicy().keepFor)
        logger.info(
            "collecting garbage",
            metadata: ["keepLast": "\(policy.keepLast)", "keepFor": "\(policy.keepFor)"])
        let report = try store.collectGarbage(policy)
        print(
            "removed \(Format.count(report.versionsRemoved, "version")), "
                + "\(Format.count(report.documentsRemoved, "deleted document")) and "
                + "\(Format.count(report.chunksRemoved, "chunk")) (\(report.bytesFreed) bytes)")
    }
}
