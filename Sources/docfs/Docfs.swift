import ArgumentParser
import DocumentFS

@main
struct Docfs: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "docfs",
        abstract: "DocFS: document stores as file systems.",
        version: DocumentFS.version
    )
}
