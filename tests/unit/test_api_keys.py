"""The one table of API keys matches kio's own (names and numbers)."""

from kio.schema.index import api_key_map

from policies import api_keys


def test_every_api_key_constant_is_kios_number_for_that_name() -> None:
    constants = {name: value for name, value in vars(api_keys).items() if name.isupper() and name != "INT_MAX"}
    assert len(constants) >= 30
    for name, value in constants.items():
        assert api_key_map[value].upper() == name, f"{name} = {value} is {api_key_map[value]} in kio"
