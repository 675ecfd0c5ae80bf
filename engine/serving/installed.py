"""What the door answers from the model store alone, with no model loaded: which models are installed,
which one a name means, whether it can do a task, a speech model's voices, a transcription's language.
The engine in this process and the server process's side of an engine process answer it the same way."""

from __future__ import annotations

from swama.engine.errors import BadInput, NotFound
from swama.engine.files.store import InstalledModel, ModelStore
from swama.engine.kinds.speech import Voices, voices_of
from swama.engine.kinds.tasks import Task, require
from swama.engine.kinds.transcription import language_of


class InstalledModels:
    store: ModelStore

    def models(self) -> list[InstalledModel]:
        return self.store.list()

    def find(self, name: str) -> InstalledModel | None:
        return self.store.find(name)

    def model(self, name: str) -> InstalledModel:
        """The installed model for `name`; 404 when it is not installed (the server never downloads)."""
        if not isinstance(name, str) or not name.strip():
            raise BadInput("Model identifier is invalid.")
        model = self.store.find(name)
        if model is None:
            raise NotFound()
        return model

    def base_of(self, model: InstalledModel) -> InstalledModel:
        """The model a request for `model` runs on: itself, or a LoRA adapter's base model (404 with the
        reason when the base is no longer installed)."""
        if model.base is None:
            return model
        base = self.store.find(model.base)
        if base is None:
            raise NotFound(f"Adapter '{model.id}' needs its base model '{model.base}', which is not installed; "
                           f"install it again (swama pull or swama create) or remove the adapter (swama rm {model.id}).")
        return base

    @staticmethod
    def require(model: InstalledModel, task: Task, name: str | None = None) -> None:
        require(model, task, name)

    def model_for(self, name: str, task: Task) -> InstalledModel:
        """The installed model for `name`, refused when it cannot do `task`."""
        model = self.model(name)
        require(model, task, name)
        return model

    def voices(self, model_id: str) -> Voices:
        """The voices a text-to-speech model offers; `Voices.pick` refuses one it does not."""
        model = self.model(model_id)
        return voices_of(model.id, model.path)

    @staticmethod
    def transcription_language(name: str | None) -> str | None:
        """The Whisper language code a request names (None: detected); refused when unknown."""
        return language_of(name)
