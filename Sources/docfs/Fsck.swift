import ArgumentParser
import DocumentEngine
import Foundation

/// `docfs fsck [STORE]`
struct Fsck: DocfsCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check a store's integrity.",
        discussion: """
            Runs SQLite's integrity check, verifies every content chunk against its SHA-256 and \
            size, the references between tables, that every wrapper is reachable from its \
            document, and that sizes agree. Reads every chunk; changes nothing.

            Prints each problem on its own line on standard output. Exit status: 0 when the \
            store is clean, 1 when problems were found, 2 when the store cannot be used at all \
            (missing, not a store, unreadable, damaged beyond checking).
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: "The store to check (default: the default store).")
    var store: String?

    func run() async throws {
        let logger = global.bootstrap()
        let location = try StoreLocation(store)
        let report: IntegrityReport
        do {
            report = try location.open(logger: logger).checkIntegrity()
        } catch {
            throw Failure(error, exitCode: 2)
        }
        for problem in report.problems { print(problem) }
        let checked =
            "\(Format.count(report.documentsChecked, "document")), "
            + "\(Format.count(report.nodesChecked, "wrapper")), \(Format.count(report.chunksChecked, "chunk")) checked"
        if report.isClean {
            print("\(location.path): clean (\(checked))")
        } else {
            printError("\(location.path): \(Format.count(report.problems.count, "problem")) (\(checked))")
            throw ExitCode(1)
        }
    }
}
